"""tether.tool.grpc_size on a real grpc.aio server, for the RPC shapes kas' own handlers do not have.

kas' listeners (every shape they serve) are covered by tests/e2e/test_kas_bad_input.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tether.tool.grpc_size import MessageSizeInterceptor, size_checked, unlimited_size_options

LIMIT = 1000


async def _echo_each(request: bytes, _context: Any) -> AsyncIterator[bytes]:
    for _ in range(2):
        yield request


async def _total_size(requests: AsyncIterator[bytes], _context: Any) -> bytes:
    return str(sum([len(message) async for message in requests])).encode()


async def _read_all(_requests: Any, context: Any) -> None:
    while (message := await context.read()) is not grpc.aio.EOF:
        await context.write(message)


class _PerCallHandler(grpc.GenericRpcHandler):
    """Makes a new handler for every call, as kas' routed and private APIs do; each answers its call number."""

    def __init__(self) -> None:
        self.calls = 0

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler_call_details.method != "/t.T/CallNumber":
            return None
        self.calls += 1
        number = self.calls

        async def answer(_request: bytes, _context: Any) -> bytes:
            return str(number).encode()

        return grpc.unary_unary_rpc_method_handler(answer)


@pytest.fixture
async def target() -> AsyncIterator[str]:
    server = grpc.aio.server(options=unlimited_size_options(), interceptors=[MessageSizeInterceptor(LIMIT)])
    handlers = {
        "EchoEach": grpc.unary_stream_rpc_method_handler(_echo_each),
        "TotalSize": grpc.stream_unary_rpc_method_handler(_total_size),
        "ReadAll": grpc.stream_stream_rpc_method_handler(_read_all),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", handlers), _PerCallHandler()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


def _assert_refused(error: grpc.aio.AioRpcError, size: int) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == f"Received message larger than max ({size} vs. {LIMIT})"


async def test_async_generator_handler(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        assert [m async for m in channel.unary_stream("/t.T/EchoEach")(b"x" * LIMIT)] == [b"x" * LIMIT] * 2
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            async for _ in channel.unary_stream("/t.T/EchoEach")(b"x" * (LIMIT + 1)):
                pass
        _assert_refused(failure.value, LIMIT + 1)


async def test_request_stream_handler(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        assert await channel.stream_unary("/t.T/TotalSize")(iter([b"x" * LIMIT, b"y"])) == b"1001"
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.stream_unary("/t.T/TotalSize")(iter([b"x", b"y" * 5000]))
        _assert_refused(failure.value, 5000)


async def test_context_read_after_messages_within_the_limit(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream("/t.T/ReadAll")()
        await call.write(b"a" * LIMIT)
        assert await call.read() == b"a" * LIMIT
        await call.write(b"b" * (LIMIT * 10))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        _assert_refused(failure.value, LIMIT * 10)


async def test_a_handler_made_per_call_is_wrapped_per_call(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        call_number = channel.unary_unary("/t.T/CallNumber")
        assert [await call_number(b"") for _ in range(3)] == [b"1", b"2", b"3"]
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call_number(b"z" * 2000)
        _assert_refused(failure.value, 2000)


def test_a_sync_handler_is_refused() -> None:
    with pytest.raises(TypeError, match="not an asyncio handler"):
        size_checked(grpc.unary_unary_rpc_method_handler(lambda request, context: request), LIMIT)
