"""The hub's access log line is written before the reply's last byte leaves (tether.hub.api.access_log)."""

from __future__ import annotations

import logging

import pytest
from starlette.types import Message, Receive, Scope, Send

from tether.hub.api.access_log import AccessLogMiddleware


async def reply(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def test_the_line_is_written_before_the_reply_ends(caplog: pytest.LogCaptureFixture) -> None:
    """A caller counting log lines right after a reply used to miss the last one (CI, test_agent_auth)."""
    lines_at_each_send: list[int] = []

    async def send(message: Message) -> None:
        lines_at_each_send.append(len(caplog.records))

    async def receive() -> Message:
        return {"type": "http.request"}

    scope: Scope = {"type": "http", "method": "GET", "path": "/api/v4/internal/kubernetes/agent_info", "headers": []}
    with caplog.at_level(logging.INFO, logger="tether.hub.access"):
        await AccessLogMiddleware(reply)(scope, receive, send)
    assert lines_at_each_send == [0, 0, 1], "one line, and it precedes the last body message"
    assert caplog.messages[0].startswith("GET /api/v4/internal/kubernetes/agent_info 204 ")


async def test_a_failed_request_still_gets_its_line(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async def send(message: Message) -> None:
        raise AssertionError("nothing is sent")

    async def receive() -> Message:
        return {"type": "http.request"}

    scope: Scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
    with caplog.at_level(logging.INFO, logger="tether.hub.access"), pytest.raises(RuntimeError):
        await AccessLogMiddleware(broken)(scope, receive, send)
    assert [m.split()[:3] for m in caplog.messages] == [["POST", "/x", "500"]]
