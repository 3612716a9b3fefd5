"""A stand-in for a workspace's editor: a real HTTP and WebSocket server (aiohttp), run inside a network namespace.

``python -m tests.support.workspace_editor <address> <port>`` serves until killed:

* ``GET /`` a small HTML page; ``GET /headers`` the request's headers, path and query as JSON;
* ``POST /upload`` reads the body as it streams and answers its size and SHA-256;
* ``GET /download?mb=N`` streams N MiB of a fixed pattern (``pattern(n)`` gives the same bytes);
* ``GET /ws`` a WebSocket that says ``hello`` first, then echoes text (``echo: ...``) and binary frames;
* ``GET /set-cookie`` answers with a ``Set-Cookie`` of its own and one that tries to replace kas' session cookie;
* ``GET /redirect`` answers 302 to ``/landing``;
* ``GET /count`` how many other requests it served (to show that refused requests never arrive), and how many
  download bytes it has written so far (``sent``).
"""

from __future__ import annotations

import hashlib
import json
import sys

from aiohttp import WSMsgType, web

#: One MiB of the download pattern.
_BLOCK = bytes(range(256)) * 4096


def pattern(mib: int) -> bytes:
    """The bytes ``GET /download?mb=<mib>`` sends."""
    return _BLOCK * mib


def app() -> web.Application:
    """The editor's application."""
    served = {"count": 0, "sent": 0}

    @web.middleware
    async def count(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        if request.path == "/count":
            return web.json_response({"count": served["count"], "sent": served["sent"]})
        served["count"] += 1
        return await handler(request)

    async def index(_request: web.Request) -> web.Response:
        return web.Response(
            text="<!doctype html><title>editor</title><h1>Workspace editor</h1>", content_type="text/html"
        )

    async def headers(request: web.Request) -> web.Response:
        pairs = [[k, v] for k, v in request.headers.items()]
        return web.json_response({"headers": pairs, "path": request.raw_path, "method": request.method})

    async def upload(request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        size = 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            size += len(chunk)
        return web.json_response({"bytes": size, "sha256": digest.hexdigest()})

    async def download(request: web.Request) -> web.StreamResponse:
        mib = int(request.query.get("mb", "1"))
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = mib * len(_BLOCK)
        await response.prepare(request)
        for _ in range(mib):
            await response.write(_BLOCK)
            served["sent"] += len(_BLOCK)
        await response.write_eof()
        return response

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("hello")
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                await ws.send_str(f"echo: {message.data}")
            elif message.type == WSMsgType.BINARY:
                await ws.send_bytes(message.data)
        return ws

    async def set_cookie(_request: web.Request) -> web.Response:
        response = web.Response(text="cookies")
        response.headers.add("Set-Cookie", "editor-theme=dark; Path=/")
        response.headers.add("Set-Cookie", "_tether_workspaces=planted-by-the-workspace; Path=/")
        response.headers.add("Set-Cookie", "_gitlab_session=planted-by-the-workspace; Path=/")
        return response

    async def redirect(_request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/landing"})

    application = web.Application(middlewares=[count], client_max_size=1024**3)
    application.add_routes(
        [
            web.get("/", index),
            web.get("/headers", headers),
            web.post("/upload", upload),
            web.get("/download", download),
            web.get("/ws", websocket),
            web.get("/set-cookie", set_cookie),
            web.get("/redirect", redirect),
            web.get("/count", index),
        ]
    )
    return application


def main() -> None:
    """Serve on the address and port given as arguments."""
    address, port = sys.argv[1], int(sys.argv[2])
    print(json.dumps({"serving": f"{address}:{port}"}), flush=True)
    web.run_app(app(), host=address, port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
