"""Fixtures of the Graph API tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether_devenv.cluster import ClusterInfo


@pytest.fixture
async def kube(k8s_cluster: ClusterInfo) -> AsyncIterator[KubeClient]:
    """An admin API client for the test cluster."""
    client = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    try:
        yield client
    finally:
        await client.close()
