"""kas' proxy listener and agentk's MakeRequest in one process, joined by an in-memory router (kas.md §5).

The real routing and tunnels are covered by ``tests/e2e/test_k8s_proxy*.py``; here the two halves meet
directly, against small local HTTP servers standing in for the API server.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from aiohttp import web
from google.rpc import status_pb2

from tests.fixtures.hub import RealHub
from tether.kube.kubeconfig import KubeCredentials
from tether.modserver.gitlab_client import GitlabClient
from tether.modules.kubernetes_api.agent.forward import AgentRequestError, KubernetesApiAgent
from tether.modules.kubernetes_api.server.auth import ProxyUserAuthorizer
from tether.modules.kubernetes_api.server.config import KubernetesApiCF, KubernetesApiListenCF
from tether.modules.kubernetes_api.server.proxy import KubernetesApiProxy
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tunnel.server.agent_conn import RoutedAgentConn
from tether.tunnel.server.router import CallerSide, RoutingError
from tether_devenv.process import free_port

API_AGENT, RAW_AGENT, ABSENT_AGENT = 901, 902, 903
#: Served by the same stand-in API server as API_AGENT; configured with ``access_as: user`` (project 78).
USER_AGENT = 904


class LoopbackRouter:
    """Stands in for the routing kas: hands each call straight to the agent half of its agent id."""

    def __init__(self, agents: dict[int, KubernetesApiAgent]) -> None:
        self.agents = agents
        self.cancelled = 0

    async def route(
        self,
        agent_id: int,
        full_method: str,
        metadata: Any,
        caller: CallerSide,
        timeout_s: float | None,
        find_timeout_s: float | None = None,
    ) -> status_pb2.Status | None:
        agent = self.agents.get(agent_id)
        if agent is None:
            raise RoutingError(grpc.StatusCode.DEADLINE_EXCEEDED, "Agent connection not found. Is agent up to date?")

        async def requests() -> AsyncIterator[grpctool_pb2.HttpRequest]:
            while (data := await caller.read()) is not None:
                yield grpctool_pb2.HttpRequest.FromString(data)

        async def send(response: grpctool_pb2.HttpResponse) -> None:
            await caller.write(response.SerializeToString())

        try:
            await agent.serve(requests(), send)
        except AgentRequestError as exc:
            return status_pb2.Status(code=exc.code.value[0], message=exc.message)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return None


class FakeApiServer:
    """An HTTP server recording what reached it: echo, body digest, held stream, WebSocket echo."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self.stream_cancelled = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_route("*", "/api/echo", self.echo)
        self.app.router.add_post("/api/body", self.body)
        self.app.router.add_get("/api/stream", self.stream)
        self.app.router.add_get("/ws", self.websocket)

    def record(self, request: web.Request) -> None:
        self.seen.append(
            {"path": request.path, "query": list(request.query.items()), "headers": list(request.headers.items())}
        )

    async def echo(self, request: web.Request) -> web.Response:
        self.record(request)
        return web.json_response(
            {"method": request.method, "query": list(request.query.items())}, headers={"X-Up": "1"}
        )

    async def body(self, request: web.Request) -> web.Response:
        self.record(request)
        data = await request.read()
        return web.json_response({"length": len(data), "sha256": hashlib.sha256(data).hexdigest()})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'{"type":"ADDED"}\n')
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise
        await response.write(b'{"type":"MODIFIED"}\n')
        await response.write_eof()
        return response

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        self.record(request)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str(message.data.upper())
            elif message.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(message.data[::-1])
        return ws


async def raw_upgrade_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A SPDY-like endpoint: 101, then every byte echoed upper-cased until the client half-closes, then BYE."""
    head = await reader.readuntil(b"\r\n\r\n")
    if b"upgrade" not in head.lower():
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
        writer.close()
        return
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
    while data := await reader.read(65536):
        writer.write(data.upper())
        await writer.drain()
    writer.write(b"BYE")
    await writer.drain()
    writer.close()


@pytest_asyncio.fixture
async def loop_env(kas_hub: RealHub) -> AsyncIterator[dict[str, Any]]:
    api = FakeApiServer()
    api_runner = web.AppRunner(api.app, handler_cancellation=True)
    await api_runner.setup()
    api_port = free_port()
    await web.TCPSite(api_runner, "127.0.0.1", api_port).start()
    raw = await asyncio.start_server(raw_upgrade_server, "127.0.0.1", 0)
    raw_port = raw.sockets[0].getsockname()[1]
    agents = {
        API_AGENT: KubernetesApiAgent(KubeCredentials(server=f"http://127.0.0.1:{api_port}", token="agent-sa-token")),
        RAW_AGENT: KubernetesApiAgent(KubeCredentials(server=f"http://127.0.0.1:{raw_port}")),
        USER_AGENT: KubernetesApiAgent(KubeCredentials(server=f"http://127.0.0.1:{api_port}", token="agent-sa-token")),
    }
    router = LoopbackRouter(agents)
    gitlab = GitlabClient(kas_hub.url, kas_hub.secret)
    config = KubernetesApiCF(listen=KubernetesApiListenCF(address="127.0.0.1:0"), url_path_prefix="/k8s-proxy")
    proxy = KubernetesApiProxy(
        config,
        RoutedAgentConn(router),
        ProxyUserAuthorizer(gitlab, 60, 0),
        "https://gitlab.example.com",  # type: ignore[arg-type]
    )
    port = await proxy.start()
    for agent_id in (API_AGENT, RAW_AGENT, ABSENT_AGENT):
        kas_hub.grant_proxy_access("pat-agent", "robot", agent_id, 77)
    session = kas_hub.grant_proxy_access("pat-user", "alice", USER_AGENT, 78, as_user=True, session_cookie=True)
    assert session is not None
    try:
        async with aiohttp.ClientSession() as client:
            yield {
                "url": f"http://127.0.0.1:{port}/k8s-proxy",
                "client": client,
                "api": api,
                "router": router,
                "session": session[0],
                "csrf": session[1],
            }
    finally:
        await proxy.stop()
        for agent in agents.values():
            await agent.close()
        await gitlab.close()
        raw.close()
        await api_runner.cleanup()


def bearer(token: str, agent_id: int = API_AGENT) -> dict[str, str]:
    return {"Authorization": f"Bearer pat:{agent_id}:{token}"}


async def test_get_is_rewritten_for_the_api_server(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    async with client.get(
        loop_env["url"] + "/api/echo?labelSelector=app%20in%20(a,b)&gitlab-agent-id=1&x=1&x=2",
        headers={
            **bearer("pat-agent"),
            "Cookie": "a=b",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "1",
            "X-Keep": "k",
        },
    ) as response:
        assert response.status == 200
        answer = await response.json()
        # The query travels as a map: order across keys is not kept, order of one key's values is.
        assert answer["method"] == "GET"
        assert sorted(answer["query"]) == [["labelSelector", "app in (a,b)"], ["x", "1"], ["x", "2"]]
        assert response.headers["X-Up"] == "1"
        assert "gitlab-kas" in ",".join(response.headers.getall("Via"))
        assert "gitlab-agent" in ",".join(response.headers.getall("Via"))
    seen = loop_env["api"].seen[-1]
    headers = dict(seen["headers"])
    assert headers["Authorization"] == "Bearer agent-sa-token"
    assert "Cookie" not in headers and "X-Hop" not in headers
    assert headers["X-Keep"] == "k"
    via = ", ".join(v for k, v in seen["headers"] if k == "Via")
    assert "gitlab-kas" in via and "gitlab-agent" in via
    assert not any(k.lower().startswith("impersonate-") for k, _ in seen["headers"])


async def test_user_access_impersonates_and_refuses_nested_impersonation(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    async with client.get(loop_env["url"] + "/api/echo", headers=bearer("pat-user", USER_AGENT)) as response:
        assert response.status == 200
    pairs = loop_env["api"].seen[-1]["headers"]
    assert ("Impersonate-User", "gitlab:user:alice") in pairs
    assert {v for k, v in pairs if k == "Impersonate-Group"} == {"gitlab:user", "gitlab:project_role:78:developer"}
    assert ("Impersonate-Extra-agent.gitlab.com%2Fid", str(USER_AGENT)) in pairs
    async with client.get(
        loop_env["url"] + "/api/echo", headers={**bearer("pat-user", USER_AGENT), "Impersonate-User": "admin"}
    ) as response:
        assert response.status == 403
        status = await response.json()
        assert status["kind"] == "Status" and status["reason"] == "Forbidden"
        assert "nested impersonation is not supported" in status["message"]


async def test_session_cookie(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    url = loop_env["url"] + f"/api/echo?gitlab-agent-id={USER_AGENT}"
    cookie = {"Cookie": f"_gitlab_kas={loop_env['session']}"}
    async with client.get(url, headers={**cookie, "X-Csrf-Token": loop_env["csrf"]}) as response:
        assert response.status == 200
    pairs = loop_env["api"].seen[-1]["headers"]
    assert ("Impersonate-Extra-agent.gitlab.com%2Faccess_type", "session_cookie") in pairs
    assert not any(k.lower() in ("cookie", "x-csrf-token") for k, _ in pairs)
    async with client.get(url, headers={**cookie, "X-Csrf-Token": "wrong"}) as response:
        assert response.status == 401
        assert response.headers["Gitlab-Unauthorized"] == "true"


async def test_refusals_are_status_json(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    base = loop_env["url"]
    cases = [
        (base.replace("/k8s-proxy", "/other") + "/api", {}, 400, "is not under '/k8s-proxy/'"),
        (base + "/api/echo", {}, 401, "no credentials"),
        (base + "/api/echo", bearer("wrong"), 401, "not valid"),
        (base + "/api/echo", bearer("pat-user", RAW_AGENT), 401, f"access to agent {RAW_AGENT}"),
        (base + "/api/echo", {**bearer("pat-agent"), "Origin": "https://evil.example"}, 403, "origin"),
        (base + "/api/echo", bearer("pat-agent", ABSENT_AGENT), 504, "Agent connection not found"),
    ]
    for url, headers, code, fragment in cases:
        async with client.get(url, headers=headers) as response:
            status = await response.json()
            assert (response.status, status["code"], status["kind"]) == (code, code, "Status"), status
            assert status["message"].startswith("GitLab Agent Server: ")
            assert fragment in status["message"], status
            assert (response.headers.get("Gitlab-Unauthorized") == "true") == (code == 401)


async def test_cors_for_the_gitlab_origin(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    origin = {"Origin": "https://gitlab.example.com"}
    async with client.options(
        loop_env["url"] + "/api/echo", headers={**origin, "Access-Control-Request-Method": "GET"}
    ) as response:
        assert response.status == 200
        assert response.headers["Access-Control-Allow-Origin"] == "https://gitlab.example.com"
    async with client.get(loop_env["url"] + "/api/echo", headers={**origin, **bearer("pat-agent")}) as response:
        assert response.status == 200
        assert response.headers["Access-Control-Allow-Credentials"] == "true"


async def test_request_bodies_stream_in_both_framings(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    payload = bytes(range(256)) * 4096  # 1 MiB

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 100_000):
            yield payload[i : i + 100_000]

    expected = {"length": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    async with client.post(loop_env["url"] + "/api/body", data=payload, headers=bearer("pat-agent")) as response:
        assert await response.json() == expected
    async with client.post(loop_env["url"] + "/api/body", data=chunks(), headers=bearer("pat-agent")) as response:
        assert await response.json() == expected
    assert "Content-Length" in dict(loop_env["api"].seen[-2]["headers"])


async def test_response_chunks_arrive_before_the_response_ends(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    api: FakeApiServer = loop_env["api"]
    api.release.clear()
    async with client.get(loop_env["url"] + "/api/stream", headers=bearer("pat-agent")) as response:
        assert await response.content.readline() == b'{"type":"ADDED"}\n'  # the server is still holding the rest
        api.release.set()
        assert await response.content.readline() == b'{"type":"MODIFIED"}\n'


async def test_client_going_away_cancels_the_routed_call(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    api: FakeApiServer = loop_env["api"]
    api.release.clear()
    api.stream_cancelled.clear()
    before = loop_env["router"].cancelled
    response = await client.get(loop_env["url"] + "/api/stream", headers=bearer("pat-agent"))
    assert await response.content.readline() == b'{"type":"ADDED"}\n'
    response.close()  # drops the connection
    await asyncio.wait_for(api.stream_cancelled.wait(), 10)
    assert loop_env["router"].cancelled == before + 1


async def test_websocket_upgrade(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    async with client.ws_connect(loop_env["url"] + "/ws", headers=bearer("pat-agent")) as ws:
        for i in range(20):
            await ws.send_str(f"hello {i}")
            assert (await ws.receive_str()) == f"HELLO {i}"
        big = bytes(range(256)) * 1000
        await ws.send_bytes(big)
        assert (await ws.receive_bytes()) == big[::-1]


async def test_raw_upgrade_relays_bytes_both_ways_and_half_close(loop_env: dict[str, Any]) -> None:
    host, port = loop_env["url"].removeprefix("http://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /k8s-proxy/spdy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer pat:{RAW_AGENT}:pat-agent\r\n"
        "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"upgrade: spdy/3.1" in head.lower()
    sent = b"abc" * 30000
    writer.write(sent)
    received = await reader.readexactly(len(sent))
    assert received == sent.upper()
    writer.write_eof()
    assert await reader.read() == b"BYE"  # the server saw the half-close, answered and closed
    writer.close()


async def test_expect_continue_bodies(loop_env: dict[str, Any]) -> None:
    client: aiohttp.ClientSession = loop_env["client"]
    payload = b"x" * 100_000
    async with client.post(
        loop_env["url"] + "/api/body", data=payload, headers=bearer("pat-agent"), expect100=True
    ) as response:
        assert (await response.json())["length"] == len(payload)


async def test_unreachable_api_server_is_502(loop_env: dict[str, Any]) -> None:
    dead = KubernetesApiAgent(KubeCredentials(server=f"http://127.0.0.1:{free_port()}"), connect_timeout_s=5)
    loop_env["router"].agents[ABSENT_AGENT] = dead
    try:
        async with loop_env["client"].get(loop_env["url"] + "/api", headers=bearer("pat-agent", ABSENT_AGENT)) as r:
            status = await r.json()
            assert r.status == 502 and status["code"] == 502
            assert (
                "GitLab Agent Server: Proxy error: the agent could not make the request: gRPC -> HTTP:"
                in status["message"]
            )
    finally:
        del loop_env["router"].agents[ABSENT_AGENT]
        await dead.close()


def frames(*messages: grpctool_pb2.HttpRequest) -> AsyncIterator[grpctool_pb2.HttpRequest]:
    async def iterate() -> AsyncIterator[grpctool_pb2.HttpRequest]:
        for message in messages:
            yield message

    return iterate()


def head(headers: dict[str, str], imp: rpc_pb2.ImpersonationConfig | None = None) -> grpctool_pb2.HttpRequest:
    header = grpctool_pb2.HttpRequest.Header(
        request=prototool_pb2.HttpRequest(
            method="GET", url_path="/api", header={k: prototool_pb2.Values(value=[v]) for k, v in headers.items()}
        ),
        content_length=0,
    )
    if imp is not None:
        header.extra.Pack(rpc_pb2.HeaderExtra(imp_config=imp))
    return grpctool_pb2.HttpRequest(header=header)


TRAILER = grpctool_pb2.HttpRequest(trailer=grpctool_pb2.HttpRequest.Trailer())


async def test_agent_refuses_nested_impersonation_and_broken_streams() -> None:
    agent = KubernetesApiAgent(KubeCredentials(server=f"http://127.0.0.1:{free_port()}"))
    sent: list[grpctool_pb2.HttpResponse] = []

    async def send(response: grpctool_pb2.HttpResponse) -> None:
        sent.append(response)

    try:
        imp = rpc_pb2.ImpersonationConfig(username="gitlab:user:alice")
        with pytest.raises(AgentRequestError) as caught:
            await agent.serve(frames(head({"Impersonate-User": "root"}, imp), TRAILER), send)
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert caught.value.message == "nested impersonation is not supported: the request carries Impersonate-User"
        with pytest.raises(AgentRequestError) as caught:
            await agent.serve(frames(TRAILER), send)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "got 'trailer' (3) as the first message" in caught.value.message
        with pytest.raises(AgentRequestError) as caught:
            await agent.serve(frames(), send)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert sent == []
    finally:
        await agent.close()
