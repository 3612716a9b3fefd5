"""Routing kas -> gateway kas -> agentk with real processes, real Redis and the real cluster (issue 3)."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tests.support.polling import poll
from tether.agentk.embedded import EmbeddedAgent
from tether.hub.kas_client import KasApiClient
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2 as pods_pb2
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2_grpc as pods_grpc
from tether.tunnel.server.router import NOT_FOUND_MESSAGE
from tether_devenv.cluster import ClusterInfo
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]


def client_for(kas: KasProc, hub: RealHub) -> KasApiClient:
    return KasApiClient(kas.api_target, hub.secret)


@pytest.fixture
def a_pod(kubectl: Kubectl, k8s_namespace: str) -> tuple[str, str]:
    """A pod in the real cluster that GetPods answers must contain."""
    kubectl.run("run", "routed-pod", "-n", k8s_namespace, "--image=registry.invalid/x:1", "--restart=Never")
    return (k8s_namespace, "routed-pod")


def names(pods: list) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(p.namespace, p.name) for p in pods}


@pytest.fixture
def tokens(kas_hub: RealHub) -> dict[str, int]:
    """Agent A (id 101, project 11) and agent B (id 102, project 11), each with a fresh token."""
    suffix = str(time.monotonic_ns())
    kas_hub.add_agent(f"token-a-{suffix}", 101, 11, "agent-a")
    kas_hub.add_agent(f"token-b-{suffix}", 102, 11, "agent-b")
    return {f"token-a-{suffix}": 101, f"token-b-{suffix}": 102}


async def test_get_pods_through_three_kas_and_connected_agents(
    system: System, k8s_cluster: ClusterInfo, a_pod: tuple[str, str], kas_hub: RealHub, tokens: dict[str, int]
) -> None:
    kas1, kas2, kas3 = system.kas(), system.kas(), system.kas()
    token_a, token_b = list(tokens)
    system.agentk(token_a, kas2, "agent-a-1")
    system.agentk(token_a, kas3, "agent-a-2")
    system.agentk(token_b, kas2, "agent-b-1")
    client = client_for(kas1, kas_hub)
    try:
        # Agent B is connected to kas 2 only; kas 1 routes to it.
        assert a_pod in names(await client.get_pods(102, timeout_s=30))

        async def both_replicas() -> list:  # type: ignore[type-arg]
            agents = await client.connected_agents_by_agent_id(101)
            return agents if len(agents) == 2 else []

        replicas = await poll(both_replicas, "both replicas of agent A to be listed", 15)
        assert len({a.connection_id for a in replicas}) == 2
        assert {a.agent_meta.pod_name for a in replicas} == {"agent-a-1", "agent-a-2"}
        assert all(a.project_id == 11 and a.agent_id == 101 for a in replicas)
        by_project = await client.connected_agents_by_project_id(11)
        assert {a.agent_id for a in by_project} == {101, 102} and len(by_project) == 3
        # Every kas answers the same (shared Redis); each routes to agent A wherever its tunnels are.
        for kas in (kas1, kas2, kas3):
            other = client_for(kas, kas_hub)
            try:
                assert len(await other.connected_agents_by_agent_id(101)) == 2
                assert a_pod in names(await other.get_pods(101, timeout_s=30))
            finally:
                await other.close()
    finally:
        await client.close()


async def test_request_waits_for_the_agent_then_completes(
    system: System, k8s_cluster: ClusterInfo, a_pod: tuple[str, str], kas_hub: RealHub, tokens: dict[str, int]
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    token_a = next(iter(tokens))
    client = client_for(kas1, kas_hub)
    try:
        pending = asyncio.ensure_future(client.get_pods(101, timeout_s=60))
        # Waiting is seen on kas 1's gauge (how soon depends on the machine's load), then it lasts.
        deadline = time.monotonic() + 20
        while kas1.gauge("tunnel_find_requests_waiting") < 1:
            assert not pending.done(), f"the request ended without waiting for its agent: {pending.exception()!r}"
            assert time.monotonic() < deadline, "the request never waited for its agent"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)
        assert not pending.done() and kas1.gauge("tunnel_find_requests_waiting") >= 1
        system.agentk(token_a, kas2)
        assert a_pod in names(await asyncio.wait_for(pending, 60))
    finally:
        await client.close()


async def test_request_for_an_absent_agent_ends_at_the_deadline(system: System, kas_hub: RealHub) -> None:
    kas1 = system.kas()
    client = client_for(kas1, kas_hub)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await client.get_pods(999, timeout_s=2)
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert failure.value.details() == NOT_FOUND_MESSAGE
        # Nothing stays waiting after the caller gave up.
        deadline = time.monotonic() + 5
        while kas1.gauge("tunnel_find_requests_waiting") != 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        await client.close()


async def test_kas_answers_not_found_message_when_its_find_timeout_ends(system: System, kas_hub: RealHub) -> None:
    kas1 = system.kas(routing={"tunnel_find_timeout": "1s"})
    client = client_for(kas1, kas_hub)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await client.get_pods(999, timeout_s=None)  # type: ignore[arg-type]
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert failure.value.details() == NOT_FOUND_MESSAGE
    finally:
        await client.close()


async def test_kill_9_of_gateway_kas(
    system: System, k8s_cluster: ClusterInfo, a_pod: tuple[str, str], kas_hub: RealHub, tokens: dict[str, int]
) -> None:
    fast_expiry = {"redis_conn_info_ttl": "3s", "redis_conn_info_refresh": "1s", "redis_conn_info_gc": "2s"}
    kas1 = system.kas(agent=fast_expiry)
    kas2 = system.kas(agent=fast_expiry)
    kas3 = system.kas(agent=fast_expiry)
    token_a = next(iter(tokens))
    both = f"grpc://127.0.0.1:{kas2.ports['agent']},127.0.0.1:{kas3.ports['agent']}"
    system.agentk_at(token_a, both, "agent-a-multi")
    client = client_for(kas1, kas_hub)
    try:
        assert a_pod in names(await client.get_pods(101, timeout_s=30))
        urls_before = set(await system.tunnel_urls(101))
        assert kas2.private_url in urls_before or kas3.private_url in urls_before
        kas2.signal(signal.SIGKILL)
        kas2.wait_exit()
        assert a_pod in names(await client.get_pods(101, timeout_s=30))

        async def dead_entries_gone() -> bool:
            return kas2.private_url not in await system.tunnel_urls(101)

        await poll(dead_entries_gone, "the killed kas' tunnel tracker entry to expire", 20)

        async def listed_again() -> bool:
            return bool(await client.connected_agents_by_agent_id(101))

        # agentk's configuration stream moves to the surviving kas (after its backoff if it was young).
        await poll(listed_again, "the agent connection to be listed via the surviving kas", 40)
    finally:
        await client.close()


async def test_sigterm_removes_entries_at_once(
    system: System, k8s_cluster: ClusterInfo, a_pod: tuple[str, str], kas_hub: RealHub, tokens: dict[str, int]
) -> None:
    kas1, kas2 = system.kas(), system.kas(routing={"shutdown_grace_period": "20s"})
    token_a = next(iter(tokens))
    system.agentk(token_a, kas2)
    client = client_for(kas1, kas_hub)
    try:
        assert a_pod in names(await client.get_pods(101, timeout_s=30))
        assert kas2.private_url in await system.tunnel_urls(101)
        kas2.signal(signal.SIGTERM)
        kas2.wait_exit(30)
        assert kas2.private_url not in await system.tunnel_urls(101)
        assert await client.connected_agents_by_agent_id(101) == []
    finally:
        await client.close()


class SlowPods(pods_grpc.PodsServicer):
    """Answers GetPods after ``delay_s`` seconds, so a call is in flight long enough to SIGTERM its kas."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.started = asyncio.Event()

    async def GetPods(self, request, context):  # type: ignore[no-untyped-def]
        self.started.set()
        await asyncio.sleep(self.delay_s)
        return pods_pb2.GetPodsResponse(pods=[pods_pb2.Pod(namespace="slow", name="answer")])


async def test_sigterm_lets_in_flight_calls_finish(system: System, kas_hub: RealHub, tokens: dict[str, int]) -> None:
    # The agent dials kas 2 itself (no load balancer), so it cannot move to kas 1: kas 2 serves it until
    # agent_move_timeout, then removes its entry, while the call in flight goes on.
    kas1, kas2 = system.kas(), system.kas(routing={"shutdown_grace_period": "20s", "agent_move_timeout": "0.5s"})
    slow = SlowPods(delay_s=3.0)
    agent = EmbeddedAgent(kas2.agent_address.removeprefix("grpc://"), next(iter(tokens)))
    agent.add_servicer(pods_grpc.add_PodsServicer_to_server, slow)
    await agent.start()
    client = client_for(kas1, kas_hub)
    try:
        call = asyncio.ensure_future(client.get_pods(101, timeout_s=30))
        await asyncio.wait_for(slow.started.wait(), 20)
        kas2.signal(signal.SIGTERM)
        await poll(_gone(system, kas2), "kas 2's Redis entries to be removed at once", 2.5)
        assert not call.done(), "the in-flight call must still be running while its kas drains"
        pods = await asyncio.wait_for(call, 20)
        assert [(p.namespace, p.name) for p in pods] == [("slow", "answer")]
        kas2.wait_exit(30)
    finally:
        await client.close()
        await agent.stop()


def _gone(system: System, kas: KasProc):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return kas.private_url not in await system.tunnel_urls(101)

    return check


async def test_redis_restart_is_healed_without_restarting_processes(
    system: System,
    tmp_path,
    k8s_cluster: ClusterInfo,
    a_pod: tuple[str, str],
    kas_hub: RealHub,
    tokens: dict[str, int],
) -> None:  # type: ignore[no-untyped-def]
    own_redis = RedisServer(tmp_path / "redis").start()
    system.redis = own_redis
    try:
        kas1, kas2 = system.kas(), system.kas()
        system.agentk(next(iter(tokens)), kas2)
        client = client_for(kas1, kas_hub)
        try:
            assert a_pod in names(await client.get_pods(101, timeout_s=30))
            own_redis.stop()
            own_redis.start()  # same port, empty data

            async def rebuilt() -> bool:
                return kas2.private_url in await system.tunnel_urls(101)

            await poll(rebuilt, "kas 2 to re-write its tunnel tracker entry", 20)
            assert a_pod in names(await client.get_pods(101, timeout_s=30))

            async def reconnected() -> bool:
                return len(await client.connected_agents_by_agent_id(101)) == 1

            await poll(reconnected, "the agent connection to be listed again", 20)
        finally:
            await client.close()
    finally:
        system.stop_all()
        system.started.clear()
        own_redis.stop()
