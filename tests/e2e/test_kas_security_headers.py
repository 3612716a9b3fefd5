"""Every HTTP answer kas makes itself carries the headers a browser needs (issue 27 item 8), on each HTTP
listener of a real kas: the Kubernetes API proxy, the workspaces listener, observability. Answers relayed from
the cluster are checked in ``test_k8s_proxy.py``, a workspace's own in ``test_workspace_access.py``.

The proxies have no route table: each kind of answer they make is listed here (refusals before and after
authentication, CORS preflight, the Graph API without a WebSocket, the malformed request's 400); the
observability listener's routes are its configured paths.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping

import pytest
from multidict import CIMultiDictProxy

from tests.fixtures.system import K8S_PROXY_PREFIX, System
from tests.support.workspace_access import ZONE, browser, workspaces_section
from tether_devenv.process import free_port

pytestmark = [pytest.mark.redis]


def check(what: str, headers: Mapping[str, str] | CIMultiDictProxy[str]) -> None:
    assert headers.get("X-Content-Type-Options") == "nosniff", what
    assert headers.get("X-Frame-Options") == "DENY", what
    policy = headers.get("Content-Security-Policy", "")
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, (what, policy)
    assert headers.get("Referrer-Policy") == "no-referrer", what


async def raw_head(port: int, request: bytes, tls: ssl.SSLContext | None = None) -> dict[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    lines = answer.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    assert lines[0].split()[1] == "400", lines[0]
    return dict(line.split(": ", 1) for line in lines[1:])


async def test_every_answer_kas_makes_itself_carries_the_security_headers(system: System) -> None:
    port = free_port()
    kas = system.kas(workspaces=workspaces_section(port))
    assert kas.k8s_proxy_ca is not None
    tls = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
    proxy = kas.k8s_proxy_url
    origin = proxy.removesuffix(K8S_PROXY_PREFIX)
    observability = f"http://127.0.0.1:{kas.ports['observability']}"
    workspace = f"http://60001-ws.{ZONE}:{port}"
    cases: list[tuple[str, str, str, dict[str, str], int]] = [
        ("proxy: no credentials", "GET", proxy + "api/v1/namespaces", {}, 401),
        ("proxy: unknown token", "GET", proxy + "api", {"Authorization": "Bearer pat:1:glpat-unknown"}, 401),
        ("proxy: outside the prefix", "GET", origin + "/elsewhere", {}, 400),
        (
            "proxy: CORS preflight",
            "OPTIONS",
            proxy + "api",
            {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "GET"},
            200,
        ),
        ("proxy: Graph API without a WebSocket", "GET", proxy + "graph", {}, 401),
        ("workspaces: a host kas does not serve", "GET", f"http://127.0.0.1:{port}/", {"Host": "evil.example"}, 421),
        ("workspaces: no workspace at this path", "GET", f"http://127.0.0.1:{port}/elsewhere", {}, 404),
        ("workspaces: the path form's slash", "GET", f"http://127.0.0.1:{port}/-/workspaces/ws/60001", {}, 308),
        ("workspaces: sign-in callback without a code", "GET", f"{workspace}/-/workspaces/-/callback", {}, 400),
        ("workspaces: sign-in callback posted", "POST", f"{workspace}/-/workspaces/-/callback", {}, 405),
        ("workspaces: no credentials", "GET", workspace + "/", {}, 401),
        ("workspaces: a browser without a session", "GET", workspace + "/", {"Accept": "text/html"}, 302),
        ("workspaces: malformed credentials", "GET", workspace + "/", {"Authorization": "Basic eA=="}, 401),
        ("workspaces: unknown token", "GET", workspace + "/", {"Authorization": "Bearer glpat-unknown"}, 401),
        ("observability: metrics", "GET", observability + "/metrics", {}, 200),
        ("observability: liveness", "GET", observability + "/liveness", {}, 200),
        ("observability: readiness", "GET", observability + "/readiness", {}, 200),
        ("observability: unknown path", "GET", observability + "/nothing", {}, 404),
        ("observability: wrong method", "POST", observability + "/metrics", {}, 405),
    ]
    async with browser(connector_ssl=tls) as client:
        for what, method, url, headers, code in cases:
            async with client.request(method, url, headers=headers, allow_redirects=False) as response:
                assert response.status == code, (what, response.status, await response.text())
                check(what, response.headers)
    malformed = b"GET / HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n"
    for what, listener, context in (
        ("proxy", kas.ports["k8s_proxy"], tls),
        ("workspaces", port, None),
        ("observability", kas.ports["observability"], None),
    ):
        check(f"{what}: malformed request", await raw_head(listener, malformed, context))
