"""agentk half of the Graph API: the ``WatchGraph`` server-streaming RPC (seed 002 "kas to agentk API").

The RPC is ``/gitlab.agent.kubernetes_api.rpc.KubernetesApi/WatchGraph``, in the service the seed names.
That service is declared by the Kubernetes API proxy's proto, so the servicer registers this one method
with a generic handler on agentk's internal server (:meth:`GraphServicer.register`); the method then
appears in the agent's ``AgentDescriptor``, which is how kas knows the agent supports the Graph API.

Identity: a request carrying ``impersonation`` (the proxy's ``access_as: user``) is computed with those
``Impersonate-*`` headers on every discovery, list and watch, so the caller sees only what RBAC lets them
list; agentk confirms it with the response header ``tether-graph-identity: impersonated``, without which kas
refuses the stream (issue 9 item 1).

Per call: the request is validated again (agentk does not trust its input; ``INVALID_ARGUMENT`` with the
field-naming reason), a :class:`~tether.modules.graph.engine.engine.GraphEngine` runs for as long as the caller
keeps the stream open, and each batch is sent as one ``WatchGraphResponse``. gRPC flow control paces the
engine: while a message waits to be sent, changes coalesce in the engine. Engine failure ends the call with
``INTERNAL``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog
from grpc import aio

from tether.kube.client import KubeClient
from tether.kube.impersonation import impersonation_headers
from tether.modagent.internal_server import InternalServer
from tether.modules.graph.agent import already_serialized
from tether.modules.graph.engine.engine import EngineOptions, GraphEngine, GraphEngineError
from tether.modules.graph.engine.request import RequestError, compile_request
from tether.modules.graph.rpc.methods import (
    IDENTITY_HEADER,
    IDENTITY_IMPERSONATED,
    WATCH_GRAPH_FULL_METHOD,
    WATCH_GRAPH_METHOD,
    WATCH_GRAPH_SERVICE,
)
from tether.modules.graph.rpc.wire import encode_response, request_from_proto
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2
from tether.tool.memory import release_free_memory

__all__ = [
    "IDENTITY_HEADER",
    "IDENTITY_IMPERSONATED",
    "WATCH_GRAPH_FULL_METHOD",
    "WATCH_GRAPH_METHOD",
    "WATCH_GRAPH_SERVICE",
    "GraphServicer",
]

_log = structlog.get_logger(__name__)


class GraphServicer:
    """Serves ``WatchGraph``.

    Args:
        kube: API client with agentk's credentials (discovery, list and watch).
        options: engine tunables (defaults: 30 s sync timeout, 20 ms batching window).
    """

    def __init__(self, kube: KubeClient, options: EngineOptions | None = None) -> None:
        self._kube = kube
        self._options = options or EngineOptions()

    def register(self, server: InternalServer) -> None:
        """Register ``WatchGraph`` on agentk's internal server (before it starts).

        Raises:
            RuntimeError: the server has already started.
        """
        server.add_generic_handler(WATCH_GRAPH_SERVICE, self.method_handlers())

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """``{"WatchGraph": handler}`` for ``add_generic_handler`` / ``method_handlers_generic_handler``."""
        return {
            WATCH_GRAPH_METHOD: grpc.unary_stream_rpc_method_handler(
                self.WatchGraph,
                request_deserializer=rpc_pb2.WatchGraphRequest.FromString,
                response_serializer=already_serialized,
            )
        }

    async def WatchGraph(
        self,
        request: rpc_pb2.WatchGraphRequest,
        context: aio.ServicerContext[rpc_pb2.WatchGraphRequest, rpc_pb2.WatchGraphResponse],
    ) -> AsyncIterator[bytes]:
        """Stream graph batches (serialized ``WatchGraphResponse`` messages) until the caller cancels.

        Raises:
            grpc.aio.AbortError: ``INVALID_ARGUMENT`` for an invalid request, ``INTERNAL`` when the engine fails.
        """
        try:
            compiled = compile_request(request_from_proto(request))
        except RequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        kube = self._kube
        if request.HasField("impersonation"):
            kube = kube.with_headers(impersonation_headers(request.impersonation))
            await context.send_initial_metadata(((IDENTITY_HEADER, IDENTITY_IMPERSONATED),))
        _log.info(
            "graph_watch_started",
            queries=len(compiled.queries),
            namespaces=compiled.namespaces.mode.value,
            impersonated=request.HasField("impersonation"),
        )
        trimmed = False
        async with GraphEngine(kube, compiled, self._options) as engine:
            while True:
                try:
                    batch = await engine.next_batch()
                except GraphEngineError as exc:
                    _log.error("graph_watch_failed", error=str(exc))
                    await context.abort(grpc.StatusCode.INTERNAL, str(exc))
                yield encode_response(batch.actions, batch.warnings)
                if not trimmed and engine.initial_state_sent:
                    # The initial lists' pages and decode buffers are free now but still counted in RSS.
                    release_free_memory()
                    trimmed = True
