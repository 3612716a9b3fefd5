"""agentk's side of a forwarded call with what upstream kas sends (issue 11): request metadata with HTTP/2
pseudo-headers (``:authority``), and failures that must be logged with their reason.

A minimal ReverseTunnel peer (real gRPC, in the test) plays kas; agentk's real tunnel loop and internal server
run against it; the call is served in-process by the handler registered on the internal server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from tether.modagent.internal_server import InternalServer
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2, rpc_pb2_grpc
from tether.tool.grpc_meta import values_to_meta
from tether.tunnel.agent.connection import TunnelConnection

ECHO = "/test.Echo/Call"


def test_values_to_meta_drops_pseudo_headers_and_reserved_keys() -> None:
    values = {
        ":authority": prototool_pb2.Values(value=["kas.example.com"]),
        ":path": prototool_pb2.Values(value=["/x"]),
        "content-type": prototool_pb2.Values(value=["application/grpc"]),
        "x-kept": prototool_pb2.Values(value=["a", "b"]),
        "blob-bin": prototool_pb2.Values(value=["\x00\xff"]),
    }
    assert values_to_meta(values) == (("x-kept", "a"), ("x-kept", "b"), ("blob-bin", b"\x00\xff"))


class _Listener:
    def on_active(self) -> None:
        pass

    def on_idle(self) -> None:
        pass


class _OneCallKas(rpc_pb2_grpc.ReverseTunnelServicer):
    """Sends one request on the first tunnel and records what agentk answers."""

    def __init__(self, method: str, meta: dict[str, list[str]]) -> None:
        self.method = method
        self.meta = meta
        self.answers: asyncio.Queue[list[rpc_pb2.ConnectRequest]] = asyncio.Queue()
        self.used = False

    async def Connect(  # type: ignore[override]
        self, request_iterator: AsyncIterator[rpc_pb2.ConnectRequest], context: Any
    ) -> AsyncIterator[rpc_pb2.ConnectResponse]:
        first = await anext(aiter(request_iterator))
        assert first.WhichOneof("msg") == "descriptor"
        if self.used:
            await asyncio.sleep(30)
            return
        self.used = True
        meta = {k: prototool_pb2.Values(value=v) for k, v in self.meta.items()}
        yield rpc_pb2.ConnectResponse(request_info=rpc_pb2.RequestInfo(method_name=self.method, meta=meta))
        yield rpc_pb2.ConnectResponse(message=rpc_pb2.Message(data=b"ping"))
        yield rpc_pb2.ConnectResponse(close_send=rpc_pb2.CloseSend())
        await self.answers.put([m async for m in request_iterator])


async def _run(method: str, meta: dict[str, list[str]]) -> tuple[list[rpc_pb2.ConnectRequest], list[dict[str, Any]]]:
    kas = _OneCallKas(method, meta)
    server = grpc.aio.server()
    rpc_pb2_grpc.add_ReverseTunnelServicer_to_server(kas, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    internal = InternalServer()

    async def echo(request: bytes, context: Any) -> bytes:
        seen = dict(context.invocation_metadata())
        if "x-fail" in seen:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "asked to fail")
        return request + b" " + str(seen.get("x-from", "")).encode()

    handler = grpc.unary_unary_rpc_method_handler(echo)
    internal.add_generic_handler("test.Echo", {"Call": handler})
    await internal.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    connection = TunnelConnection(channel, internal.handler, internal.descriptor(), _Listener())
    with capture_logs() as logs:
        task = asyncio.create_task(connection.run())
        try:
            answers = await asyncio.wait_for(kas.answers.get(), 30)
        finally:
            connection.abort()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await channel.close()
            await internal.stop(None)
            await server.stop(None)
    return answers, logs


def _kinds(answers: list[rpc_pb2.ConnectRequest]) -> list[str | None]:
    return [m.WhichOneof("msg") for m in answers]


@pytest.mark.asyncio
async def test_pseudo_headers_from_kas_are_dropped_and_the_call_succeeds() -> None:
    answers, logs = await _run(ECHO, {":authority": ["kas"], ":scheme": ["http"], "x-from": ["kas"]})
    assert _kinds(answers) == ["header", "message", "trailer"]
    assert answers[1].message.data == b"ping kas"
    assert not [entry for entry in logs if entry["event"] == "tunnel_call_failed"]


@pytest.mark.asyncio
async def test_a_failed_tunnel_call_is_logged_with_its_reason() -> None:
    answers, logs = await _run(ECHO, {"x-fail": ["1"]})
    assert _kinds(answers) == ["header", "trailer", "error"]
    failed = [entry for entry in logs if entry["event"] == "tunnel_call_failed"]
    assert failed == [
        {
            "event": "tunnel_call_failed",
            "log_level": "warning",
            "method": ECHO,
            "code": "FAILED_PRECONDITION",
            "reason": "asked to fail",
        }
    ]


@pytest.mark.asyncio
async def test_a_call_to_an_unknown_method_is_logged_with_its_reason() -> None:
    answers, logs = await _run("/test.Echo/Missing", {})
    assert "error" in _kinds(answers)
    failed = [entry for entry in logs if entry["event"] == "tunnel_call_failed"]
    assert len(failed) == 1 and failed[0]["code"] == "UNIMPLEMENTED" and failed[0]["reason"]
