"""The graph page's WebSocket, relayed to kas' Graph API (``<kas.k8s_proxy_url>graph``) on the hub's origin.

GitLab serves kas under its own origin (``/-/kubernetes-agent/`` behind its front proxy) so that the browser's
session cookie and CSRF token reach kas without CORS. The hub does the same for the one endpoint the console
uses: the browser opens ``/-/console/graph?gitlab-agent-id=<id>&gitlab-csrf-token=<token>`` with subprotocol
``gitlab-agent-graph-api``; the hub opens kas' ``/graph`` with the browser's session as a ``_gitlab_kas``
cookie and these parameters, and copies messages both ways. kas authenticates the session with the hub's
``authorize_proxy_user`` (kas.md §4.5): the relay itself grants nothing. Close codes and reasons are passed on.

Checks here: the browser's ``Origin`` must be the hub's (a page elsewhere cannot ride the cookie); kas' handshake
has a 10 s deadline; a message from kas above 64 MiB closes the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from urllib.parse import urlencode, urlsplit

import aiohttp
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from tether.hub.api.browser import KAS_COOKIE, SESSION_COOKIE
from tether.hub.api.state import hub_state
from tether.hub.config import HubConfig
from tether.hub.session_tokens import kas_cookie_value

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
SUBPROTOCOL = "gitlab-agent-graph-api"
RELAY_PATH = "/-/console/graph"
CONNECT_TIMEOUT_S = 10.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_PASSED = ("gitlab-agent-id", "gitlab-csrf-token")
#: Close codes a server may send (RFC 6455 §7.4.1); others (1005, 1006, 1015) become 1011.
_SENDABLE = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014}


def origin_allowed(origin: str | None, host: str | None, config: HubConfig) -> bool:
    """Whether a WebSocket from ``origin`` may use the browser's cookies.

    Allowed: the hub's ``external_url`` origin or the request's own host (either scheme), as for form posts.
    Browsers always send ``Origin`` on WebSocket handshakes, so a missing one is refused.
    """
    if origin is None:
        return False
    base = urlsplit(config.base_url)
    allowed = {f"{base.scheme}://{base.netloc}".lower()}
    if host:
        allowed |= {f"http://{host}".lower(), f"https://{host}".lower()}
    return origin.strip().lower() in allowed


def _ssl_context(config: HubConfig) -> ssl.SSLContext | bool:
    if config.kas.k8s_proxy_ca_certificate_file is None:
        return True
    return ssl.create_default_context(cafile=str(config.kas.k8s_proxy_ca_certificate_file))


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    # The reason of a close frame holds at most 123 bytes; the page also gets it whole as an error message.
    with contextlib.suppress(Exception):
        await websocket.send_text(json.dumps({"error": {"code": code, "reason": reason}}))
    with contextlib.suppress(Exception):
        await websocket.close(code if code in _SENDABLE else 1011, reason.encode()[:123].decode(errors="ignore"))


@router.websocket(RELAY_PATH)
async def relay(websocket: WebSocket) -> None:
    """Relay one Graph API session between the browser and kas (module docstring)."""
    config = hub_state(websocket).config  # type: ignore[arg-type]
    if not origin_allowed(websocket.headers.get("origin"), websocket.headers.get("host"), config):
        log.info("graph relay refused a WebSocket from another origin")
        await websocket.close(1008, "origin not allowed")
        return
    proxy_url = config.kas.k8s_proxy_url
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in websocket.scope.get("subprotocols", []) else None)
    if proxy_url is None:
        await _close(websocket, 1011, "the hub does not know kas' Kubernetes API proxy (kas.k8s_proxy_url)")
        return
    params = [(name, value) for name, value in websocket.query_params.multi_items() if name in _PASSED]
    headers = {}
    # The hub's own session cookie: ``_gitlab_kas`` is scoped to kas' path and does not come here (browser.py).
    session_id = websocket.cookies.get(SESSION_COOKIE)
    if session_id:
        headers["Cookie"] = f"{KAS_COOKIE}={kas_cookie_value(session_id)}"
    url = f"{proxy_url}graph?{urlencode(params)}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)) as client:
        try:
            upstream = await client.ws_connect(
                url,
                protocols=(SUBPROTOCOL,),
                headers=headers,
                ssl=_ssl_context(config),
                max_msg_size=MAX_MESSAGE_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            )
        except aiohttp.WSServerHandshakeError as exc:
            reason = (
                "kas refused the session: sign in again, or you have no access to this agent"
                if exc.status == 401
                else f"kas answered HTTP {exc.status}"
            )
            await _close(websocket, 1008 if exc.status in (401, 403) else 1011, reason)
            return
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("graph relay: cannot reach kas: %r", exc)
            await _close(websocket, 1013, "kas is unreachable; try again later")
            return
        async with upstream:
            await _pump(websocket, upstream)


async def _pump(websocket: WebSocket, upstream: aiohttp.ClientWebSocketResponse) -> None:
    async def to_kas() -> None:
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    await upstream.send_str(message["text"])
                elif message.get("bytes") is not None:
                    await upstream.send_bytes(message["bytes"])

    async def to_browser() -> None:
        code, reason = 1011, "the connection to kas failed"
        while True:
            message = await upstream.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                await websocket.send_text(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await websocket.send_bytes(message.data)
            else:
                if message.type == aiohttp.WSMsgType.CLOSE:
                    code, reason = int(message.data), str(message.extra or "")
                break
        with contextlib.suppress(Exception):
            await websocket.close(code if code in _SENDABLE else 1011, reason.encode()[:123].decode(errors="ignore"))

    tasks = [asyncio.ensure_future(to_kas()), asyncio.ensure_future(to_browser())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
