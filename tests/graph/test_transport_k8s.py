"""The Graph API transport: ``WatchGraph`` on agentk's internal server, and kas' WebSocket session on top of it.

kas' ``/graph`` handler (``kas_ws.serve_graph_websocket``) runs on a local aiohttp server and reaches the
agent's internal server through ``channel_opener``; the agent watches the real cluster.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from google.rpc import status_pb2
from grpc import aio

from tests.fixtures.k8s import Kubectl
from tests.graph.harness import GraphModel, include
from tether.kube.client import KubeClient
from tether.modagent.internal_server import InternalServer
from tether.modules.graph.agent.servicer import WATCH_GRAPH_FULL_METHOD, GraphServicer
from tether.modules.graph.engine.engine import EngineOptions
from tether.modules.graph.server.websocket import (
    GRAPH_SUBPROTOCOL,
    OpenWatchGraph,
    agent_opener,
    agent_supports_watch_graph,
    channel_opener,
    serve_graph_websocket,
)
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc.rpc_pb2 import ImpersonationConfig
from tether.pb.gitlab.agent.prototool.prototool_pb2 import Values
from tether.tunnel.server.agent_conn import RoutedAgentConn
from tether.tunnel.server.router import RoutingError

pytestmark = pytest.mark.k8s


def _make_request_handler() -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Stand-in for the proxy's MakeRequest in the same service, to check both coexist."""

    async def make_request(_requests: Any, _context: Any) -> None:
        return None

    return {"MakeRequest": grpc.stream_stream_rpc_method_handler(make_request)}


async def _agent(kube: KubeClient | None, *, with_graph: bool = True) -> InternalServer:
    server = InternalServer()
    server.add_generic_handler("gitlab.agent.kubernetes_api.rpc.KubernetesApi", _make_request_handler())
    if with_graph:
        assert kube is not None
        GraphServicer(kube, EngineOptions(sync_timeout_s=10.0)).register(server)
    await server.start()
    return server


async def _kas(opener: OpenWatchGraph, impersonation: ImpersonationConfig | None = None) -> TestServer:
    async def graph(request: web.Request) -> web.StreamResponse:
        return await serve_graph_websocket(request, opener, impersonation)

    app = web.Application()
    app.router.add_get("/graph", graph)
    server = TestServer(app)
    await server.start_server()
    return server


@pytest.fixture
async def agent(kube: KubeClient) -> AsyncIterator[InternalServer]:
    server = await _agent(kube)
    try:
        yield server
    finally:
        await server.stop(None)


@pytest.fixture
async def kas(agent: InternalServer) -> AsyncIterator[TestServer]:
    server = await _kas(channel_opener(agent.channel))
    try:
        yield server
    finally:
        await server.close()


def test_descriptor_advertises_watch_graph_next_to_make_request(agent: InternalServer) -> None:
    descriptor = agent.descriptor()
    assert agent_supports_watch_graph(descriptor)
    (service,) = [s for s in descriptor.services if s.name == "gitlab.agent.kubernetes_api.rpc.KubernetesApi"]
    assert {m.name for m in service.methods} == {"MakeRequest", "WatchGraph"}


async def _session(kas: TestServer, session: aiohttp.ClientSession, **kwargs: Any) -> aiohttp.ClientWebSocketResponse:
    return await session.ws_connect(
        kas.make_url("/graph"), protocols=kwargs.pop("protocols", [GRAPH_SUBPROTOCOL]), **kwargs
    )


async def _read_until(ws: aiohttp.ClientWebSocketResponse, model: GraphModel, predicate: Any) -> None:
    while not predicate(model):
        message = await ws.receive(timeout=60)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        model.apply(message.data.encode())


async def test_websocket_session_and_second_message(kas: TestServer, kubectl: Kubectl, k8s_namespace: str) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", "cm")
    request = {"queries": [include("resource == 'configmaps'")], "namespaces": {"names": [k8s_namespace]}}
    async with aiohttp.ClientSession() as http:
        ws = await _session(kas, http)
        assert ws.protocol == GRAPH_SUBPROTOCOL
        await ws.send_str(json.dumps(request))
        model = GraphModel()
        await _read_until(ws, model, lambda m: m.find("configmaps", "cm", k8s_namespace) is not None)
        kubectl.run("-n", k8s_namespace, "create", "configmap", "second")
        await _read_until(ws, model, lambda m: m.find("configmaps", "second", k8s_namespace) is not None)
        await ws.send_str("{}")  # any further message closes the session
        message = await ws.receive(timeout=30)
        while message.type == aiohttp.WSMsgType.TEXT:
            message = await ws.receive(timeout=30)
        assert message.type == aiohttp.WSMsgType.CLOSE
        assert ws.close_code == 1008
        assert "single request message" in message.extra


async def _close_of(
    kas: TestServer, send: Any, protocols: list[str] | None = None
) -> tuple[int | None, str, list[dict[str, Any]]]:
    async with aiohttp.ClientSession() as http:
        ws = await _session(kas, http, protocols=protocols if protocols is not None else [GRAPH_SUBPROTOCOL])
        if isinstance(send, bytes):
            await ws.send_bytes(send)
        elif send is not None:
            await ws.send_str(send)
        texts: list[dict[str, Any]] = []
        while True:
            message = await ws.receive(timeout=60)
            if message.type == aiohttp.WSMsgType.TEXT:
                texts.append(json.loads(message.data))
                continue
            return ws.close_code, str(message.extra or ""), texts


async def test_invalid_requests_close_with_reasons(kas: TestServer) -> None:
    code, reason, texts = await _close_of(kas, '{"queries": []}')
    assert code == 1007 and "queries: at least one query is required" in reason and not texts
    code, reason, texts = await _close_of(kas, "not json")
    assert code == 1007 and "invalid JSON" in reason
    long_cel = json.dumps({"queries": [include("group == 1 " + "&& true " * 30)]})
    code, reason, texts = await _close_of(kas, long_cel)
    assert code == 1007 and len(reason.encode()) <= 123
    (error,) = [t["error"] for t in texts]  # too long for the close frame: sent as an error message too
    assert error["code"] == 1007 and error["code_string"] == "StatusInvalidFramePayloadData"
    assert error["reason"].startswith("invalid request: queries[0].include.resource_selector_expression")
    code, reason, _ = await _close_of(kas, b"\x00binary")
    assert code == 1003
    code, reason, _ = await _close_of(kas, '{"queries": []}', protocols=[])
    assert code == 1002 and GRAPH_SUBPROTOCOL in reason


async def test_plain_http_is_rejected(kas: TestServer) -> None:
    async with aiohttp.ClientSession() as http, http.get(kas.make_url("/graph")) as response:
        assert response.status == 400


async def test_agent_without_watch_graph() -> None:
    old_agent = await _agent(None, with_graph=False)
    try:
        assert not agent_supports_watch_graph(old_agent.descriptor())
        kas = await _kas(channel_opener(old_agent.channel))
        try:
            code, reason, texts = await _close_of(kas, json.dumps({"queries": [include("true")]}))
        finally:
            await kas.close()
    finally:
        await old_agent.stop(None)
    assert code == 1011
    assert "Update the agent" in (texts[0]["error"]["reason"] if texts else reason)


async def test_agent_validates_its_input(agent: InternalServer) -> None:
    call = agent.channel.unary_stream(
        WATCH_GRAPH_FULL_METHOD,
        request_serializer=rpc_pb2.WatchGraphRequest.SerializeToString,
        response_deserializer=rpc_pb2.WatchGraphResponse.FromString,
    )
    request = rpc_pb2.WatchGraphRequest()
    request.queries.add().include.resource_selector_expression = "resource"
    with pytest.raises(aio.AioRpcError) as info:
        async for _ in call(request):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "queries[0].include.resource_selector_expression" in (info.value.details() or "")


async def test_grpc_stream_of_real_cluster(agent: InternalServer, kubectl: Kubectl, k8s_namespace: str) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", f"cm-{uuid.uuid4().hex[:6]}")
    opener = channel_opener(agent.channel)
    request = rpc_pb2.WatchGraphRequest()
    request.queries.add().include.resource_selector_expression = "resource == 'configmaps'"
    request.namespaces.names.append(k8s_namespace)
    seen: set[str] = set()
    stream = opener(request)
    async for response in stream:
        seen.update(a.set_vertex.vertex.name for a in response.actions if a.WhichOneof("action") == "set_vertex")
        if any(name.startswith("cm-") for name in seen):
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert "kube-root-ca.crt" in seen


class ChannelRouter:
    """Stands in for kas' router: relays a routed call's raw frames to the agent over a gRPC channel."""

    def __init__(self, channel: aio.Channel | None, error: RoutingError | None = None) -> None:
        self.channel = channel
        self.error = error
        self.calls: list[tuple[int, str]] = []

    async def route(
        self,
        agent_id: int,
        full_method: str,
        metadata: Any,
        caller: Any,
        timeout_s: float | None,
        find_timeout_s: float | None = None,
    ) -> Any:
        self.calls.append((agent_id, full_method))
        if self.error is not None:
            raise self.error
        assert self.channel is not None
        request = await caller.read()
        assert await caller.read() is None
        method = self.channel.unary_stream(full_method, request_serializer=bytes, response_deserializer=bytes)
        try:
            async for data in method(request):
                await caller.write(data)
        except aio.AioRpcError as exc:
            return status_pb2.Status(code=exc.code().value[0], message=exc.details() or "")
        return None


async def test_agent_opener_relays_and_maps_errors(agent: InternalServer, kubectl: Kubectl, k8s_namespace: str) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", "routed")
    router = ChannelRouter(agent.channel)
    kas = await _kas(agent_opener(RoutedAgentConn(router), 42))
    try:
        request = {"queries": [include("resource == 'configmaps'")], "namespaces": {"names": [k8s_namespace]}}
        async with aiohttp.ClientSession() as http:
            ws = await _session(kas, http)
            await ws.send_str(json.dumps(request))
            model = GraphModel()
            await _read_until(ws, model, lambda m: m.find("configmaps", "routed", k8s_namespace) is not None)
            await ws.close()
        assert router.calls == [(42, WATCH_GRAPH_FULL_METHOD)]
        # no tunnel serves WatchGraph in time (agent offline or too old): 1011, asking to update the agent
        valid = {"queries": [include("true", label_selector="a=b")]}
        router.channel = None
        router.error = RoutingError(
            grpc.StatusCode.DEADLINE_EXCEEDED, "Agent connection not found. Is agent up to date and connected?"
        )
        code, reason, texts = await _close_of(kas, json.dumps(valid))
        assert code == 1011
        assert (
            "Update the agent" in texts[0]["error"]["reason"]
            and "Agent connection not found" in texts[0]["error"]["reason"]
        )
        router.error = RoutingError(grpc.StatusCode.UNAVAILABLE, "gateway kas failed")
        code, reason, _ = await _close_of(kas, json.dumps(valid))
        assert code == 1013 and "gateway kas failed" in reason
    finally:
        await kas.close()


def _unaware_agent_handler() -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """An agent from before issue 9: serves WatchGraph with its own identity, ignoring ``impersonation``."""

    async def watch_graph(_request: rpc_pb2.WatchGraphRequest, _context: Any) -> AsyncIterator[bytes]:
        response = rpc_pb2.WatchGraphResponse()
        vertex = response.actions.add().set_vertex.vertex
        vertex.version, vertex.resource, vertex.namespace, vertex.name = "v1", "secrets", "other", "not-yours"
        yield response.SerializeToString()

    return {
        "WatchGraph": grpc.unary_stream_rpc_method_handler(
            watch_graph, request_deserializer=rpc_pb2.WatchGraphRequest.FromString, response_serializer=bytes
        )
    }


class HeaderRelayingRouter(ChannelRouter):
    """A :class:`ChannelRouter` that also relays the agent's response header, as kas' router does."""

    async def route(
        self,
        agent_id: int,
        full_method: str,
        metadata: Any,
        caller: Any,
        timeout_s: float | None,
        find_timeout_s: float | None = None,
    ) -> Any:
        assert self.channel is not None
        request = await caller.read()
        method = self.channel.unary_stream(full_method, request_serializer=bytes, response_deserializer=bytes)
        call = method(request)
        header = await call.initial_metadata()
        await caller.send_header({k: Values(value=[str(v)]) for k, v in header})
        async for data in call:
            await caller.write(data)
        return None


async def test_an_agent_that_ignores_the_callers_identity_is_refused() -> None:
    """access_as: user with an agent that does not confirm impersonation: nothing relayed, close 1008."""
    old_agent = InternalServer()
    old_agent.add_generic_handler("gitlab.agent.kubernetes_api.rpc.KubernetesApi", _unaware_agent_handler())
    await old_agent.start()
    identity = ImpersonationConfig(username="gitlab:user:alice", groups=["gitlab:user"])
    try:
        routed = agent_opener(RoutedAgentConn(HeaderRelayingRouter(old_agent.channel)), 1)
        for opener in (channel_opener(old_agent.channel), routed):
            kas = await _kas(opener, identity)
            try:
                code, reason, texts = await _close_of(kas, json.dumps({"queries": [include("true")]}))
            finally:
                await kas.close()
            assert code == 1008, (code, reason)
            assert "identity" in (texts[-1]["error"]["reason"] if texts else reason)
            assert not [t for t in texts if "actions" in t], "no vertex of the agent's own view is relayed"
            kas = await _kas(opener, None)  # access_as: agent: the agent's own identity is what is asked for
            try:
                code, _, texts = await _close_of(kas, json.dumps({"queries": [include("true")]}))
            finally:
                await kas.close()
            assert code == 1000 and any("actions" in t for t in texts)
    finally:
        await old_agent.stop(None)
