"""agentk half of the seed's example API: ``gitlab.agent.pods.rpc.Pods/GetPods`` (seed 000/001).

Registered on agentk's internal server, reached by kas through a reverse tunnel ("Agent module A ...
retrieves and returns the Pod list", seed 001 "High level schema").
"""

from __future__ import annotations

import grpc
import structlog
from grpc import aio

from tether.kube.client import KubeClient, KubeError
from tether.modagent.api import AgentApi
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2, rpc_pb2_grpc

__all__ = ["PodsAgentFactory", "PodsServicer"]

_log = structlog.get_logger(__name__)


class PodsServicer(rpc_pb2_grpc.PodsServicer):
    """Lists every pod of the cluster.

    Args:
        kube: API client with permission to list pods in all namespaces.
        page_size: pods fetched per list request (the API server paginates with ``limit``/``continue``).
    """

    def __init__(self, kube: KubeClient, *, page_size: int = 500) -> None:
        self._kube = kube
        self._page_size = page_size

    async def GetPods(
        self,
        request: rpc_pb2.GetPodsRequest,
        context: aio.ServicerContext[rpc_pb2.GetPodsRequest, rpc_pb2.GetPodsResponse],
    ) -> rpc_pb2.GetPodsResponse:
        """Return ``GetPodsResponse{pods}`` sorted by namespace, then name.

        ``request`` fields (agent id, connection id) are routing hints for kas and ignored here.

        Raises:
            grpc.aio.AbortError: via ``context.abort`` with ``UNAVAILABLE`` when the API server fails.
        """
        try:
            listing = await self._kube.list_all("/api/v1/pods", limit=self._page_size)
        except KubeError as exc:
            _log.warning("pods_list_failed", error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"listing pods from the Kubernetes API failed: {exc}")
        pods = sorted(
            (
                rpc_pb2.Pod(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")))
                for meta in (item.get("metadata") or {} for item in listing.items)
            ),
            key=lambda pod: (pod.namespace, pod.name),
        )
        return rpc_pb2.GetPodsResponse(pods=pods)


class PodsAgentFactory:
    """agentk half of ``pods``: ``GetPods`` on the internal server."""

    name = "pods"
    leader_only = False

    def new(self, api: AgentApi) -> Module:
        """Register ``Pods`` on the internal server."""
        api.internal_server.add_servicer(rpc_pb2_grpc.add_PodsServicer_to_server, PodsServicer(api.kube))
        return IdleModule(self.name)
