"""kas half of the Graph API: ``/graph`` on the Kubernetes API proxy endpoint (issue 6, graph.md).

The proxy authenticates the request as any proxied one and hands it here with the identity it imposes; the
session calls ``WatchGraph`` on the agent through ``ServerApi.agent_conn`` (``websocket.py``).
"""

from __future__ import annotations

from aiohttp import web

from tether.modserver.api import ServerApi
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2 as kubernetes_api_pb2

__all__ = ["GRAPH_PATH", "GraphServerFactory"]

#: Where the Graph API lives, below the proxy's ``url_path_prefix``.
GRAPH_PATH = "/graph"


class GraphServerFactory:
    """kas half of ``graph``: serves :data:`GRAPH_PATH` on the Kubernetes API proxy."""

    name = "graph"

    def new(self, api: ServerApi) -> Module:
        """Register :data:`GRAPH_PATH` on the proxy endpoint (served only when the proxy is configured)."""

        async def serve(
            request: web.BaseRequest,
            agent_id: int,
            impersonation: kubernetes_api_pb2.ImpersonationConfig | None,
            metadata: tuple[tuple[str, str], ...],
        ) -> web.StreamResponse:
            # Imported at the first session: a kas without the proxy never loads the Graph API
            # (tests/e2e/test_minimal_imports.py).
            from tether.modules.graph.server.websocket import agent_opener, serve_graph_websocket  # noqa: PLC0415

            return await serve_graph_websocket(request, agent_opener(api.agent_conn, agent_id, metadata), impersonation)

        api.register_proxy_path(GRAPH_PATH, serve)
        return IdleModule(self.name)
