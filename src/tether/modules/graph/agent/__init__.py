"""agentk half of ``graph``: ``KubernetesApi/WatchGraph`` on the internal server, served by the graph engine.

The method is registered at start-up, but the engine (with CEL) is imported by the first ``WatchGraph``
call, so an agentk nobody asks for a graph does not carry it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from tether.kube.client import KubeClient
from tether.modagent.api import AgentApi
from tether.modshared.module import IdleModule, Module
from tether.modules.graph.rpc.methods import WATCH_GRAPH_METHOD, WATCH_GRAPH_SERVICE
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2


def watch_graph_handler(kube: KubeClient) -> grpc.RpcMethodHandler[Any, Any]:
    """The ``WatchGraph`` method handler; it loads ``GraphServicer`` and its engine on the first call."""

    async def watch_graph(
        request: rpc_pb2.WatchGraphRequest,
        context: aio.ServicerContext[rpc_pb2.WatchGraphRequest, rpc_pb2.WatchGraphResponse],
    ) -> AsyncIterator[bytes]:
        from tether.modules.graph.agent.servicer import GraphServicer  # noqa: PLC0415

        async for response in GraphServicer(kube).WatchGraph(request, context):
            yield response

    return grpc.unary_stream_rpc_method_handler(
        watch_graph,
        request_deserializer=rpc_pb2.WatchGraphRequest.FromString,
        response_serializer=already_serialized,
    )


def already_serialized(message: bytes) -> bytes:
    """Response serializer of ``WatchGraph``: the servicer yields ``WatchGraphResponse`` bytes it wrote itself."""
    return message


class GraphAgentFactory:
    """Registers ``WatchGraph`` (the Graph API, docs/graph.md) on the internal server."""

    name = "graph"
    leader_only = False

    def new(self, api: AgentApi) -> Module:
        """Register ``WatchGraph``."""
        api.internal_server.add_generic_handler(
            WATCH_GRAPH_SERVICE, {WATCH_GRAPH_METHOD: watch_graph_handler(api.kube)}
        )
        return IdleModule(self.name)
