"""What agentk says about itself (``entity.AgentMeta``), shared by the modules that send it.

Upstream hands it to every agent module in ``modagent.Config``; here ``agent_configuration`` (each
``ConfigurationRequest``) and ``agent_registrar`` (each ``Register``) build it the same way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import tether
from tether.kube.client import ServerVersion
from tether.pb.gitlab.agent.entity import entity_pb2

__all__ = ["build_agent_meta"]


def build_agent_meta(kube_version: ServerVersion | None, env: Mapping[str, str] | None = None) -> entity_pb2.AgentMeta:
    """What agentk says about itself in every ``ConfigurationRequest`` (``entity.AgentMeta``, kas.md §6.2).

    Args:
        kube_version: the cluster's ``/version``, or None when it could not be read.
        env: environment (default ``os.environ``): ``POD_NAMESPACE`` (default ``default``) and ``POD_NAME``
            (default: the host name), set upstream through the downward API (kas.md §8.1).
    """
    env = os.environ if env is None else env
    meta = entity_pb2.AgentMeta(
        version=tether.__version__,
        commit_id="",
        pod_namespace=env.get("POD_NAMESPACE") or "default",
        pod_name=env.get("POD_NAME") or socket.gethostname(),
    )
    if kube_version is not None:
        meta.kubernetes_version.CopyFrom(
            entity_pb2.KubernetesVersion(
                major=kube_version.major,
                minor=kube_version.minor,
                git_version=kube_version.git_version,
                platform=kube_version.platform,
            )
        )
    return meta
