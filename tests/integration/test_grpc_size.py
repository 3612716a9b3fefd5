"""tether.tool.grpc_size on a real grpc.aio server and agentk's channel arguments on a real channel.

kas' own listeners (every shape they serve, and kas' memory while it refuses a 48 MiB message) are covered by
tests/e2e/test_kas_bad_input.py; here, the shapes kas' handlers do not have, and the receiving side of agentk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tether.agentk.config import AgentkConfig, KasAddress
from tether.tool.grpc_size import receive_limit_options

LIMIT = 1000


async def _echo_each(request: bytes, _context: Any) -> AsyncIterator[bytes]:
    for _ in range(2):
        yield request


async def _total_size(requests: AsyncIterator[bytes], _context: Any) -> bytes:
    return str(sum([len(message) async for message in requests])).encode()


async def _read_all(_requests: Any, context: Any) -> None:
    while (message := await context.read()) is not grpc.aio.EOF:
        await context.write(message)


async def _answer_of_size(request: bytes, _context: Any) -> bytes:
    return b"a" * int(request)


@pytest.fixture
async def target() -> AsyncIterator[str]:
    server = grpc.aio.server(options=receive_limit_options(LIMIT))
    handlers = {
        "EchoEach": grpc.unary_stream_rpc_method_handler(_echo_each),
        "TotalSize": grpc.stream_unary_rpc_method_handler(_total_size),
        "ReadAll": grpc.stream_stream_rpc_method_handler(_read_all),
        "AnswerOfSize": grpc.unary_unary_rpc_method_handler(_answer_of_size),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


def _assert_refused(error: grpc.aio.AioRpcError, size: int) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == f"SERVER: Received message larger than max ({size} vs. {LIMIT})"


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


async def test_answers_are_not_limited(target: str) -> None:
    """kas sends what it builds or relays (already within a peer's limit): no send limit on the server."""
    async with grpc.aio.insecure_channel(target) as channel:
        assert len(await channel.unary_unary("/t.T/AnswerOfSize")(b"50000")) == 50_000


async def test_agentk_refuses_an_oversize_message_from_kas(target: str) -> None:
    """agentk's channel to kas (tunnels, configuration) has Core's limit too: a larger answer is refused."""
    config = AgentkConfig(KasAddress(target, False, "127.0.0.1"), "token", max_receive_message_bytes=LIMIT)
    async with grpc.aio.insecure_channel(target, options=config.channel_options()) as channel:
        assert len(await channel.unary_unary("/t.T/AnswerOfSize")(str(LIMIT).encode())) == LIMIT
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.unary_unary("/t.T/AnswerOfSize")(b"30000")
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The client's own refusal, inside "Stream removed (...)".
        assert f"CLIENT: Received message larger than max (30000 vs. {LIMIT})" in (failure.value.details() or "")


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0 bytes"):
        receive_limit_options(-1)
