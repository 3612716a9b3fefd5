"""Every answer of the hub carries the headers a browser needs (issue 27 item 8): each route of the application,
the static files, and the error answers (401, 404, 405, 413, 422), on a real hub."""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

import httpx
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from tests.fixtures.hub import RealHub
from tests.hub.workspace_helpers import workspace_setup
from tether.hub.app import create_app
from tether.hub.console.web import STATIC_DIR

_PARAM = re.compile(r"\{([^}:]+)(:path)?\}")


def check(response: httpx.Response) -> None:
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    headers = response.headers
    assert headers.get("x-content-type-options") == "nosniff", where
    assert headers.get("x-frame-options") == "DENY", where
    policy = headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy, where
    if not headers.get("content-type", "").startswith("text/html"):
        assert "default-src 'none'" in policy, where
    assert headers.get("referrer-policy") in ("same-origin", "no-referrer"), where


def _routes(hub: RealHub) -> list[tuple[BaseRoute, str]]:
    """Every route of the hub's application with its full path (FastAPI 0.16x keeps included routers whole)."""
    app = create_app(hub.config, bytes(32))
    found: list[tuple[BaseRoute, str]] = []
    for route in app.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is None:
            found.append((route, getattr(route, "path", "")))
        else:
            found += [(c.original_route, c.path or getattr(c.original_route, "path", "")) for c in contexts()]
    return found


def _requests(hub: RealHub) -> list[tuple[str, str]]:
    """(method, path) for every route of the hub, parameters filled with plausible values."""
    wanted: list[tuple[str, str]] = []
    for route, full_path in _routes(hub):
        path = _PARAM.sub(lambda m: "a/b" if m.group(2) else "1", full_path)
        if isinstance(route, (APIRoute, Route)):
            wanted += [(method, path) for method in sorted(route.methods or {"GET"})]
        elif isinstance(route, (APIWebSocketRoute, WebSocketRoute)):
            wanted.append(("GET", path))  # not a WebSocket handshake: an HTTP answer all the same
        elif isinstance(route, Mount):
            files = sorted(p.name for p in STATIC_DIR.glob("*.js"))
            assert files, "the console ships scripts"
            wanted += [("GET", f"{path}/{name}") for name in files] + [("GET", f"{path}/missing.js")]
        else:
            raise AssertionError(f"route of an unknown kind: {route!r}")
    return wanted


def test_every_route_and_error_answer_carries_the_security_headers(hub: RealHub) -> None:
    requests = _requests(hub)
    assert len(requests) > 50
    statuses: set[int] = set()
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        for method, path in requests:
            response = client.request(method, path, json={} if method in ("POST", "PUT", "PATCH") else None)
            check(response)
            statuses.add(response.status_code)
        for path in ("/users/sign_in", "/-/console/static/console.js", "/api/v4/user", "/no/such/page"):
            check(client.get(path))
        check(client.get("/api/v4/projects", headers={"Authorization": "Bearer glpat-unknown"}))
        check(client.delete("/-/health"))  # 405
        check(client.post("/users/sign_in", content=b"\xff" * 10, headers={"Content-Type": "text/plain"}))
    assert {200, 401, 404}.issubset(statuses), statuses


def test_internal_route_refusing_an_oversized_body_carries_the_security_headers(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    url = urlsplit(hub.api_url + "/internal/kubernetes/modules/remote_development/reconcile")
    headers = {**hub.kas_headers(), "Gitlab-Agent-Api-Request": ws.agent_token}
    head = f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head += "Content-Length: 100000000\r\nConnection: close\r\n\r\n"
    with socket.create_connection((url.hostname or "", url.port or 80), timeout=30) as sock:
        sock.sendall(head.encode())  # the body never comes: the declared length is refused first
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, *lines = answer.split(b"\r\n\r\n")[0].decode().split("\r\n")
    assert status_line.split()[1] == "413", status_line
    received = httpx.Headers([tuple(line.split(": ", 1)) for line in lines])  # type: ignore[misc]
    check(httpx.Response(413, headers=received, request=httpx.Request("POST", url.geturl())))
