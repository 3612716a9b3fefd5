"""What the caller and the agent see of each other through kas 1 -> kas 2 -> tunnel is unchanged.

The agent is agentk's real tunnel machinery in the test process (``EmbeddedAgent``) serving raw methods,
so the test controls exactly what the agent sends: headers, trailers, status codes with details, a
bidirectional stream, and a call that only ends when the caller cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, wrappers_pb2
from google.rpc import status_pb2

from tests.fixtures.hub import RealHub
from tests.fixtures.system import KasProc, System
from tether.agentk.embedded import EmbeddedAgent
from tether.tool.grpc_stream import CallWriter
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, mint

pytestmark = pytest.mark.redis
AGENT_ID = 301
SERVICE = "tether.test.Probe"


class Probe:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.seen_metadata: dict[str, Any] = {}

    async def chat(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        self.seen_metadata = dict(context.invocation_metadata())
        await context.send_initial_metadata((("x-agent-header", "hello"), ("x-agent-bin", b"\x00\xff")))
        async for request in requests:
            yield request[::-1]
        context.set_trailing_metadata((("x-agent-trailer", "bye"),))

    async def early(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """Answers the first request and ends the call without reading the rest (a server may)."""
        async for _request in requests:
            yield b"answered"
            return

    async def fail(self, request: bytes, context: Any) -> bytes:
        detail = any_pb2.Any()
        detail.Pack(wrappers_pb2.StringValue(value="why"))
        status = status_pb2.Status(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="nope", details=[detail])
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, "nope", (("grpc-status-details-bin", status.SerializeToString()),)
        )
        return b""

    async def hang(self, request: bytes, context: Any) -> bytes:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""


@pytest.fixture
async def probe_path(system: System, kas_hub: RealHub) -> AsyncIterator[tuple[KasProc, Probe]]:
    token = "probe-token-passthrough"
    kas_hub.add_agent(token, AGENT_ID, 3)
    kas1, kas2 = system.kas(), system.kas()
    probe = Probe()
    agent = EmbeddedAgent(kas2.agent_address.removeprefix("grpc://"), token)
    agent.add_generic_handler(
        SERVICE,
        {
            "Chat": grpc.stream_stream_rpc_method_handler(probe.chat),
            "Early": grpc.stream_stream_rpc_method_handler(probe.early),
            "Fail": grpc.unary_unary_rpc_method_handler(probe.fail),
            "Hang": grpc.unary_unary_rpc_method_handler(probe.hang),
        },
    )
    await agent.start()
    await agent.wait_first_tunnel()
    try:
        yield kas1, probe
    finally:
        await agent.stop()


def metadata(hub: RealHub) -> tuple[tuple[str, str], ...]:
    token = mint(hub.secret, ISSUER_GITLAB, AUDIENCE_KAS, 60)
    return (("authorization", f"Bearer {token}"), ("kas-hop-routing-agent-id", str(AGENT_ID)), ("x-caller", "c1"))


async def test_bidi_stream_headers_and_trailers_pass_through(
    probe_path: tuple[KasProc, Probe], kas_hub: RealHub
) -> None:
    kas1, probe = probe_path
    async with grpc.aio.insecure_channel(kas1.api_target) as channel:
        call = channel.stream_stream(f"/{SERVICE}/Chat")(metadata=metadata(kas_hub), timeout=30)
        replies = []
        for word in (b"abc", b"", b"\x00\x01\x02" * 1000):
            await call.write(word)
            replies.append(await call.read())
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert replies == [b"cba", b"", (b"\x00\x01\x02" * 1000)[::-1]]
        headers = dict(await call.initial_metadata())
        assert headers["x-agent-header"] == "hello" and headers["x-agent-bin"] == b"\x00\xff"
        assert dict(await call.trailing_metadata())["x-agent-trailer"] == "bye"
        assert await call.code() == grpc.StatusCode.OK
    assert probe.seen_metadata.get("x-caller") == "c1"
    assert "kas-hop-routing-agent-id" not in probe.seen_metadata
    assert "authorization" not in probe.seen_metadata


async def test_status_code_and_details_pass_through(probe_path: tuple[KasProc, Probe], kas_hub: RealHub) -> None:
    kas1, _ = probe_path
    async with grpc.aio.insecure_channel(kas1.api_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.unary_unary(f"/{SERVICE}/Fail")(b"x", metadata=metadata(kas_hub), timeout=30)
    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert failure.value.details() == "nope"
    details = dict(failure.value.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    value = wrappers_pb2.StringValue()
    status.details[0].Unpack(value)
    assert value.value == "why"


async def test_unknown_method_is_unimplemented_from_the_agent(
    probe_path: tuple[KasProc, Probe], kas_hub: RealHub
) -> None:
    kas1, _ = probe_path
    async with grpc.aio.insecure_channel(kas1.api_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await channel.unary_unary(f"/{SERVICE}/Missing")(b"x", metadata=metadata(kas_hub), timeout=3)
    # No tunnel advertises the method, so kas keeps looking until the caller's deadline.
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_caller_cancellation_reaches_the_agent(probe_path: tuple[KasProc, Probe], kas_hub: RealHub) -> None:
    kas1, probe = probe_path
    async with grpc.aio.insecure_channel(kas1.api_target) as channel:
        call = channel.unary_unary(f"/{SERVICE}/Hang")(b"x", metadata=metadata(kas_hub), timeout=60)
        await asyncio.sleep(1.0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await asyncio.wait_for(probe.cancelled.wait(), 10)


async def test_agent_ending_before_the_last_request_is_not_internal(
    probe_path: tuple[KasProc, Probe], kas_hub: RealHub
) -> None:
    """Issue 9: writes racing the end of a call turned it into ``INTERNAL: ... Failed "execute_batch"``.

    The agent's server answers the first request and ends; the requests still in flight through kas and
    agentk must be dropped, and the caller must get the agent's answer with status OK, every time.
    """
    kas1, _probe = probe_path
    codes: dict[str, int] = {}
    async with grpc.aio.insecure_channel(kas1.api_target) as channel:
        for _ in range(20):
            call: Any = channel.stream_stream(f"/{SERVICE}/Early")(metadata=metadata(kas_hub), timeout=30)
            writer = CallWriter(call)
            for _message in range(8):
                await writer.write(b"r" * 4096)
            await writer.done_writing()
            answers = [message async for message in call]
            code = await call.code()
            codes[code.name] = codes.get(code.name, 0) + 1
            assert answers == [b"answered"], (code, await call.details())
    assert codes == {"OK": 20}
