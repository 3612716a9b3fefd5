"""The thin Kubernetes client against the real local API server: credentials, pagination, errors."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
import yaml

from tests.fixtures.k8s import Kubectl
from tether.kube.client import KubeApiError, KubeClient
from tether.kube.kubeconfig import KubeConfigError, KubeCredentials, load_credentials, load_kubeconfig
from tether_devenv.cluster import ClusterInfo

pytestmark = pytest.mark.k8s


def write_kubeconfig(path: Path, cluster: dict[str, object], user: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


def test_loads_the_cluster_kubeconfig(k8s_cluster: ClusterInfo) -> None:
    credentials = load_credentials(str(k8s_cluster.kubeconfig))
    assert credentials.server == k8s_cluster.server
    assert credentials.token == k8s_cluster.token
    assert credentials.ca_pem == k8s_cluster.ca_file.read_bytes()
    assert credentials.namespace == "default"


async def test_server_version(k8s_cluster: ClusterInfo) -> None:
    client = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    try:
        version = await client.server_version()
    finally:
        await client.close()
    assert version.major == "1"
    assert version.git_version.startswith(f"v1.{version.minor.rstrip('+')}.")
    assert version.platform


async def test_relative_files_and_inline_data(k8s_cluster: ClusterInfo, tmp_path: Path) -> None:
    # certificate-authority and tokenFile relative to the kubeconfig's directory.
    directory = tmp_path / "conf"
    directory.mkdir()
    shutil.copy(k8s_cluster.ca_file, directory / "ca.crt")
    (directory / "token").write_text(k8s_cluster.token + "\n")
    relative = write_kubeconfig(
        directory / "config", {"server": k8s_cluster.server, "certificate-authority": "ca.crt"}, {"tokenFile": "token"}
    )
    # certificate-authority-data inline.
    ca_data = base64.b64encode(k8s_cluster.ca_file.read_bytes()).decode()
    inline = write_kubeconfig(
        tmp_path / "inline",
        {"server": k8s_cluster.server, "certificate-authority-data": ca_data},
        {"token": k8s_cluster.token},
    )
    for path in (relative, inline):
        credentials = load_kubeconfig([path])
        assert credentials.namespace == "team"
        client = KubeClient(credentials)
        try:
            assert (await client.get_json("/api"))["kind"] == "APIVersions"
        finally:
            await client.close()


def test_kubeconfig_errors(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        load_kubeconfig([tmp_path / "missing"])
    exec_user = write_kubeconfig(tmp_path / "exec", {"server": "https://x"}, {"exec": {"command": "aws"}})
    with pytest.raises(KubeConfigError, match="'exec' authentication is not supported"):
        load_kubeconfig([exec_user])
    with pytest.raises(KubeConfigError, match="context 'other' not found"):
        load_kubeconfig([exec_user], context="other")


async def test_list_all_follows_continue(kubectl: Kubectl, k8s_cluster: ClusterInfo, k8s_namespace: str) -> None:
    items = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i}", "labels": {"test": "pagination"}},
            "data": {"i": str(i)},
        }
        for i in range(7)
    ]
    kubectl.run(
        "apply",
        "-n",
        k8s_namespace,
        "-f",
        "-",
        input_text=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    client = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    try:
        listing = await client.list_all(
            f"/api/v1/namespaces/{k8s_namespace}/configmaps", {"labelSelector": "test=pagination"}, limit=3
        )
    finally:
        await client.close()
    assert listing.pages == 3
    assert sorted(item["metadata"]["name"] for item in listing.items) == [f"cm-{i}" for i in range(7)]
    assert listing.resource_version


async def test_api_errors_carry_the_status(k8s_cluster: ClusterInfo, k8s_namespace: str) -> None:
    client = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    try:
        with pytest.raises(KubeApiError) as caught:
            await client.get_json(f"/api/v1/namespaces/{k8s_namespace}/configmaps/does-not-exist")
    finally:
        await client.close()
    assert caught.value.status == 404
    assert caught.value.reason == "NotFound"
    assert "does-not-exist" in caught.value.message

    stranger = KubeClient(
        KubeCredentials(server=k8s_cluster.server, ca_pem=k8s_cluster.ca_file.read_bytes(), token="not-a-token")
    )
    try:
        with pytest.raises(KubeApiError) as caught:
            await stranger.get_json("/api/v1/pods")
    finally:
        await stranger.close()
    assert caught.value.status == 401
    assert caught.value.reason == "Unauthorized"
