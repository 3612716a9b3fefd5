"""kas' agent connection (``ServerApi.agent_conn``) over a stand-in router: messages, errors, cancellation.

The real router, gateways and tunnels are covered by ``tests/e2e/test_routing.py`` and the proxy tests; here the
seam's own contract: typed messages both ways, the router's failures as ``routing`` errors, the agent's status as
the agent's error, the deadline and metadata handed to the router, and ``cancel`` ending the routed call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2

from tether.modserver.agent_conn import AgentCallError, AgentMethod, unary
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tunnel.server.agent_conn import RoutedAgentConn
from tether.tunnel.server.router import CallerSide, RoutingError

GET_PODS = AgentMethod("/gitlab.agent.pods.rpc.Pods/GetPods", rpc_pb2.GetPodsRequest, rpc_pb2.GetPodsResponse)


class FakeRouter:
    """Answers each routed call with ``answers`` (one response per request), then ``status``, or raises ``error``."""

    def __init__(self, answers: int = 1, status: status_pb2.Status | None = None) -> None:
        self.answers = answers
        self.status = status
        self.error: RoutingError | None = None
        self.routed: list[tuple[int, str, Any, float | None, float | None]] = []
        self.cancelled = asyncio.Event()
        self.hold = False

    async def route(
        self,
        agent_id: int,
        full_method: str,
        metadata: Any,
        caller: CallerSide,
        timeout_s: float | None,
        find_timeout_s: float | None = None,
    ) -> status_pb2.Status | None:
        self.routed.append((agent_id, full_method, metadata, timeout_s, find_timeout_s))
        if self.error is not None:
            raise self.error
        try:
            requests = []
            while (data := await caller.read()) is not None:
                requests.append(rpc_pb2.GetPodsRequest.FromString(data))
            await caller.send_header({"x-agent": prototool_pb2.Values(value=["1"])})
            for index in range(self.answers):
                pod = rpc_pb2.Pod(namespace="ns", name=f"pod-{index}-{requests[0].agent_id}")
                await caller.write(rpc_pb2.GetPodsResponse(pods=[pod]).SerializeToString())
            if self.hold:
                await asyncio.Event().wait()
            await caller.set_trailer({"x-end": prototool_pb2.Values(value=["2"])})
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return self.status


async def test_unary_call_carries_agent_id_method_deadline_and_metadata() -> None:
    router = FakeRouter()
    response = await unary(
        RoutedAgentConn(router), 7, GET_PODS, rpc_pb2.GetPodsRequest(agent_id=7), timeout_s=3.0, metadata=[("a", "b")]
    )
    assert [p.name for p in response.pods] == ["pod-0-7"]
    assert router.routed == [(7, GET_PODS.full_method, (("a", "b"),), 3.0, None)]


async def test_stream_gives_typed_responses_and_metadata() -> None:
    router = FakeRouter(answers=3)

    async def requests() -> Any:
        yield rpc_pb2.GetPodsRequest(agent_id=9)

    call = RoutedAgentConn(router).call(9, GET_PODS, requests(), find_timeout_s=1.5)
    names = [response.pods[0].name async for response in call]
    assert names == ["pod-0-9", "pod-1-9", "pod-2-9"]
    assert await call.initial_metadata() == (("x-agent", "1"),)
    assert call.trailing_metadata() == (("x-end", "2"),)
    assert router.routed[0][4] == 1.5
    call.cancel()  # a no-op once the call ended


async def test_routing_failure_and_agent_status_are_told_apart() -> None:
    router = FakeRouter()
    router.error = RoutingError(grpc.StatusCode.DEADLINE_EXCEEDED, "Agent connection not found")
    with pytest.raises(AgentCallError) as routing:
        await unary(RoutedAgentConn(router), 1, GET_PODS, rpc_pb2.GetPodsRequest(agent_id=1))
    assert (routing.value.routing, routing.value.code, routing.value.message) == (
        True,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "Agent connection not found",
    )
    router = FakeRouter(status=status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="api down"))
    with pytest.raises(AgentCallError) as agent:
        await unary(RoutedAgentConn(router), 1, GET_PODS, rpc_pb2.GetPodsRequest(agent_id=1))
    assert (agent.value.routing, agent.value.code, agent.value.message) == (
        False,
        grpc.StatusCode.UNAVAILABLE,
        "api down",
    )


async def test_unary_refuses_an_answer_of_several_messages() -> None:
    with pytest.raises(AgentCallError) as error:
        await unary(RoutedAgentConn(FakeRouter(answers=2)), 1, GET_PODS, rpc_pb2.GetPodsRequest(agent_id=1))
    assert error.value.code == grpc.StatusCode.INTERNAL and not error.value.routing


async def test_cancel_ends_the_routed_call() -> None:
    router = FakeRouter(answers=1)
    router.hold = True

    async def requests() -> Any:
        yield rpc_pb2.GetPodsRequest(agent_id=4)

    call = RoutedAgentConn(router).call(4, GET_PODS, requests())
    first = await anext(aiter(call))
    assert first.pods[0].name == "pod-0-4"
    call.cancel()
    await asyncio.wait_for(router.cancelled.wait(), 5)


async def test_a_slow_reader_holds_the_router_back() -> None:
    """Back-pressure: the router waits while the module has not read what the pipe holds."""
    router = FakeRouter(answers=10_000)

    async def requests() -> Any:
        yield rpc_pb2.GetPodsRequest(agent_id=5)

    call = RoutedAgentConn(router).call(5, GET_PODS, requests())
    await anext(aiter(call))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not router.cancelled.is_set()
    call.cancel()
    await asyncio.wait_for(router.cancelled.wait(), 5)
