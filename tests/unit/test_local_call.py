"""A tunnelled call served in-process (tether.modagent.local_call) answers as grpcio's server would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tether.modagent.local_call import LocalCall, SinkClosed
from tether.tool.grpc_meta import Metadata


class Sink:
    """Records the frames a call sends back; ``closed`` plays a tunnel that ended."""

    def __init__(self, closed: bool = False) -> None:
        self.frames: list[tuple[str, Any]] = []
        self.closed = closed
        self.ended = asyncio.Event()

    async def header(self, metadata: Metadata) -> None:
        self._check()
        self.frames.append(("header", metadata))

    async def message(self, data: bytes) -> None:
        self._check()
        self.frames.append(("message", data))

    async def end(self, code: grpc.StatusCode, details: str, trailers: Metadata) -> None:
        self._check()
        self.frames.append(("end", (code, details, trailers)))
        self.ended.set()

    def _check(self) -> None:
        if self.closed:
            raise SinkClosed


async def _serve(handler: grpc.RpcMethodHandler[Any, Any], requests: list[bytes], meta: Metadata = ()) -> Sink:
    sink = Sink()
    call = LocalCall(handler, meta, sink)
    for data in requests:
        await call.send(data)
    await call.close_send()
    await asyncio.wait_for(call.wait(), 10)
    return sink


async def test_a_stream_handler_sees_every_message_and_its_header_goes_first() -> None:
    async def shout(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        await context.send_initial_metadata((("x-head", "1"),))
        async for data in requests:
            await context.write(data.upper())
        context.set_trailing_metadata((("x-tail", "2"),))

    sink = await _serve(grpc.stream_stream_rpc_method_handler(shout), [b"a", b"b", b"c"])
    assert sink.frames == [
        ("header", (("x-head", "1"),)),
        ("message", b"A"),
        ("message", b"B"),
        ("message", b"C"),
        ("end", (grpc.StatusCode.OK, "", (("x-tail", "2"),))),
    ]


async def test_serializers_are_applied_and_a_unary_answer_is_written() -> None:
    async def double(number: int, context: Any) -> int:
        return number * 2

    handler = grpc.unary_unary_rpc_method_handler(
        double, request_deserializer=lambda b: int(b.decode()), response_serializer=lambda n: str(n).encode()
    )
    sink = await _serve(handler, [b"21"])
    assert [f for f in sink.frames if f[0] == "message"] == [("message", b"42")]


async def test_abort_set_code_and_exceptions_end_with_grpcios_statuses() -> None:
    async def aborts(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.NOT_FOUND, "gone", (("x-why", "because"),))
        raise AssertionError("abort returned")

    async def sets_code(request: bytes, context: Any) -> None:
        context.set_code(grpc.StatusCode.ALREADY_EXISTS)
        context.set_details("twice")

    async def raises(request: bytes, context: Any) -> bytes:
        raise ValueError("bad")

    ends = []
    for method in (aborts, sets_code, raises):
        sink = await _serve(grpc.unary_unary_rpc_method_handler(method), [b"x"])
        assert sink.frames[0] == ("header", ())
        ends.append(sink.frames[-1][1])
    assert ends[0] == (grpc.StatusCode.NOT_FOUND, "gone", (("x-why", "because"),))
    assert ends[1] == (grpc.StatusCode.ALREADY_EXISTS, "twice", ())
    assert ends[2] == (grpc.StatusCode.UNKNOWN, "Unexpected <class 'ValueError'>: bad", ())


async def test_kas_deadline_ends_the_call_with_deadline_exceeded() -> None:
    async def hangs(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(60)
        return b""

    sink = await _serve(grpc.unary_unary_rpc_method_handler(hangs), [b"x"], (("tether-timeout-ms", "50"),))
    assert sink.frames[-1] == ("end", (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ()))


async def test_a_message_that_does_not_decode_ends_the_call_internal() -> None:
    def refuse(data: bytes) -> Any:
        raise ValueError("not a number")

    async def echo(requests: AsyncIterator[Any], context: Any) -> None:
        async for item in requests:
            await context.write(item)

    handler = grpc.stream_stream_rpc_method_handler(echo, request_deserializer=refuse)
    sink = await _serve(handler, [b"x"])
    code, details, _ = sink.frames[-1][1]
    assert code is grpc.StatusCode.INTERNAL and "deserializing" in details


async def test_a_handler_that_stops_reading_holds_back_the_tunnel() -> None:
    """Back-pressure: kas' frames wait in the tunnel, not in an unbounded queue in agentk."""
    release = asyncio.Event()

    async def slow(requests: AsyncIterator[bytes], context: Any) -> None:
        await release.wait()
        async for _ in requests:
            pass

    call = LocalCall(grpc.stream_stream_rpc_method_handler(slow), (), Sink())
    assert await call.send(b"1")  # one message ahead, like a stream window
    second = asyncio.create_task(call.send(b"2"))
    await asyncio.sleep(0.05)
    assert not second.done(), "the second message must wait for the handler"
    release.set()
    assert await asyncio.wait_for(second, 5)
    await call.close_send()
    await asyncio.wait_for(call.wait(), 5)


async def test_a_closed_tunnel_stops_the_call_quietly() -> None:
    async def talks(requests: AsyncIterator[bytes], context: Any) -> None:
        await context.write(b"never delivered")

    sink = Sink(closed=True)
    call = LocalCall(grpc.stream_stream_rpc_method_handler(talks), (), sink)
    await call.close_send()
    await asyncio.wait_for(call.wait(), 5)
    assert sink.frames == [] and not sink.ended.is_set()


async def test_cancel_reaches_the_handler() -> None:
    cancelled = asyncio.Event()

    async def waits(requests: AsyncIterator[bytes], context: Any) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    call = LocalCall(grpc.stream_stream_rpc_method_handler(waits), (), Sink())
    await asyncio.sleep(0)
    call.cancel()
    await asyncio.wait_for(call.wait(), 5)
    assert cancelled.is_set()
