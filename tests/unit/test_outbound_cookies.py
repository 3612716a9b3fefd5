"""agentk's and kas' HTTP clients keep no cookies between requests (a finding of issue 28's review).

agentk sends every user's forwarded request through one aiohttp session per module (``OutboundHttp``). With
aiohttp's default cookie jar, a ``Set-Cookie`` in one user's answer (an API server relays it from a Service
behind ``/api/v1/.../services/<name>/proxy/``) was stored and sent with every later request of every user
to that host, whenever the host is a name and not an IP address. A proxy relays cookies; it never keeps them.
The same holds for kas' hub client (each call carries its own JWT) and agentk's own API client.

Real local HTTP servers named ``localhost`` (aiohttp keeps no cookies for IP addresses, so a test against
127.0.0.1 would pass without the fix).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import yarl
from aiohttp import web

from tether.kube.client import KubeClient
from tether.kube.kubeconfig import KubeCredentials
from tether.modserver.gitlab_client import GitlabClient
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.http_grpc.outbound import OutboundHttp, RequestFrames

_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse


async def _cookie_server(path: str) -> tuple[web.AppRunner, int, list[str | None]]:
    """Answers every request with a session cookie; records the ``Cookie`` header each request carried."""
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response({"agent_id": 1, "project_id": 2})
        response.set_cookie("session", "secret-of-the-first-caller", path="/")
        return response

    app = web.Application()
    app.router.add_route("*", path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "localhost", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port, seen


async def _frames() -> AsyncIterator[_Request]:
    request = prototool_pb2.HttpRequest(method="GET", url_path="/api/v1/namespaces")
    yield _Request(header=_Request.Header(request=request))
    yield _Request(trailer=_Request.Trailer())


async def test_a_cookie_set_for_one_forwarded_request_is_not_sent_with_the_next() -> None:
    runner, port, seen = await _cookie_server("/api/v1/namespaces")
    http = OutboundHttp(None, connect_timeout_s=5)
    answers: list[_Response] = []

    async def send(message: _Response) -> None:
        answers.append(message)

    try:
        for _ in range(2):
            frames = RequestFrames(_frames())
            header = await frames.header()
            url = yarl.URL(f"http://localhost:{port}/api/v1/namespaces")
            await http.forward(frames, header, url, [("Host", f"localhost:{port}")], False, send)
    finally:
        await http.close()
        await runner.cleanup()
    assert seen == [None, None]
    # The caller still gets the cookie: it is relayed, not kept.
    heads = [m.header.response.header for m in answers if m.HasField("header")]
    assert [list(head["Set-Cookie"].value) for head in heads] == [["session=secret-of-the-first-caller; Path=/"]] * 2


#: Clients that call one process on behalf of many: (path they call, client for a base URL, one call).
_CLIENTS: dict[str, tuple[str, Callable[[str], Any], Callable[[Any], Awaitable[Any]]]] = {
    "kas_hub_client": (
        "/api/v4/internal/kubernetes/agent_info",
        lambda url: GitlabClient(url, b"s" * 32),
        lambda client: client.get_agent_info("agent-token"),
    ),
    "agentk_api_client": (
        "/api/v1/namespaces/default",
        lambda url: KubeClient(KubeCredentials(server=url, token="agentk-token")),
        lambda client: client.get_json("/api/v1/namespaces/default"),
    ),
}


@pytest.mark.parametrize("name", list(_CLIENTS))
async def test_a_client_sends_no_cookie_its_server_set(name: str) -> None:
    path, make, call = _CLIENTS[name]
    runner, port, seen = await _cookie_server(path)
    client = make(f"http://localhost:{port}")
    try:
        for _ in range(2):
            await call(client)
    finally:
        await client.close()
        await runner.cleanup()
    assert seen == [None, None]
