"""Contract suite of the shared kas state: every test runs against real Redis and the in-memory backend.

Covers kas.md §3.1 (expiring hash), §3.2 (tunnel tracker), §3.3 (agent tracker), §3.5 (pub/sub) and seed 000
(expiry, refresh, clean-up on shutdown, transactions, grouped expiry, pub-sub notifications).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import tether_devenv.redis_server as redis_server_module
from tests.support.polling import poll
from tether.kas.instance_registry import KasInstanceRegistry
from tether.modserver.agent_tracker import AgentTracker
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.event.event_pb2 import AgentConnected, AgentDisconnected, GitPushEvent, TunnelsAvailable
from tether.pb.gitlab.agent.kas.instance_pb2 import KasInstanceInfo
from tether.pb.gitlab.agent.redistool.redistool_pb2 import ExpiringValue
from tether.tool.events import EventBus
from tether.tool.expiring_hash import EntryTtl, ExpiringHash, GcHook, HashBackend, run_every
from tether.tool.memory_backend import MemoryBackend
from tether.tool.redis_backend import RedisBackend
from tether.tunnel.server.tracker import TunnelTracker
from tether_devenv.redis_server import RedisServer

pytestmark = pytest.mark.redis

POLL_LIMIT = 5.0  # seconds; an upper bound for polling, never an expected duration
TTL = 60.0  # seconds: long enough that real key expiry never interferes, unless a test wants it
PREFIX = "gitlab-kas"


class FakeClock:
    """Unix time in seconds that only moves when told: drives the per-field ``expires_at``."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Store:
    """One storage under test plus the operations a test needs that the HashBackend protocol does not offer."""

    kind: str
    backend: HashBackend
    url: str | None
    raw: aioredis.Redis | None
    _extra: list[HashBackend] = field(default_factory=list)

    def peer(self) -> HashBackend:
        """A backend of another kas on the same storage (memory: the same object, it is per process)."""
        if self.url is None:
            return self.backend
        other = RedisBackend.from_url(self.url)
        self._extra.append(other)
        return other

    def with_gc_hook(self, hook: GcHook) -> HashBackend:
        """A backend whose GC awaits ``hook`` between scan and commit (memory: a fresh, empty storage)."""
        created: HashBackend = (
            MemoryBackend(gc_before_exec=hook)
            if self.url is None
            else RedisBackend.from_url(self.url, gc_before_exec=hook)
        )
        self._extra.append(created)
        return created

    async def wipe(self) -> None:
        """Lose all data, as a Redis restart without persistence does."""
        if self.raw is not None:
            await self.raw.flushall()
        else:
            assert isinstance(self.backend, MemoryBackend)
            self.backend.flushall()

    async def expire_time_ms(self, key: bytes) -> int:
        """Absolute key expiry in ms (PEXPIRETIME; memory: on its own clock)."""
        if self.raw is not None:
            return int(await self.raw.execute_command("PEXPIRETIME", key))  # type: ignore[no-untyped-call]
        assert isinstance(self.backend, MemoryBackend)
        return self.backend.pexpiretime(key)

    async def aclose(self) -> None:
        for extra in self._extra:
            await extra.close()


@pytest.fixture(params=["redis", "memory"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[HashBackend]:
    """The backend under test: a RedisBackend on the flushed private Redis, or a fresh MemoryBackend."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        created: HashBackend = RedisBackend.from_url(url)
    else:
        created = MemoryBackend()
    try:
        yield created
    finally:
        await created.close()


@pytest.fixture
async def store(backend: HashBackend, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if isinstance(backend, RedisBackend):
        url: str = request.getfixturevalue("redis_url")
        raw = aioredis.Redis.from_url(url)
        result = Store("redis", backend, url, raw)
    else:
        result = Store("memory", backend, None, None)
    try:
        yield result
    finally:
        await result.aclose()
        if result.raw is not None:
            await result.raw.aclose()


@contextlib.asynccontextmanager
async def running(*coroutines: Awaitable[None]) -> AsyncIterator[None]:
    """Run background loops for the duration of the block, then cancel them."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def started_bus(backend: HashBackend, stack: contextlib.AsyncExitStack) -> EventBus:
    bus = EventBus(backend, PREFIX)
    await stack.enter_async_context(running(bus.run()))
    async with asyncio.timeout(POLL_LIMIT):
        await bus.wait_subscribed()
    return bus


def le(value: int) -> bytes:
    return struct.pack("<q", value)


def agent_info(agent_id: int, connection_id: int, project_id: int) -> ConnectedAgentInfo:
    info = ConnectedAgentInfo(agent_id=agent_id, connection_id=connection_id, project_id=project_id)
    info.agent_meta.version = "v17.0.0"
    info.agent_meta.pod_name = f"agentk-{connection_id}"
    info.connected_at.FromSeconds(1_700_000_000)
    return info


def by_agent(key_id: int) -> bytes:
    return b"test:by_agent:" + le(key_id)


# --- HashBackend primitives ---------------------------------------------------------------------------------------


async def test_set_fields_gives_grouped_keys_one_expiry(store: Store) -> None:
    backend = store.backend
    await backend.set_fields([(b"k1", {"a": b"1", "b": b"2"}), (b"k2", {"c": b"3"})], TTL)

    assert await backend.scan(b"k1") == {"a": b"1", "b": b"2"}
    assert await backend.scan(b"k2") == {"c": b"3"}
    first, second = await store.expire_time_ms(b"k1"), await store.expire_time_ms(b"k2")
    assert first > 0
    # Redis 7.0 does not freeze its clock inside EXEC, so two PEXPIREs of one transaction may differ by its 1 ms tick.
    assert abs(first - second) <= 1


async def test_set_fields_is_one_multi_exec_on_redis(redis_url: str) -> None:
    """Redis only (MONITOR); the memory backend has no await inside set_fields, so it cannot interleave."""
    backend = RedisBackend.from_url(redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with raw.monitor() as monitor:
            await backend.set_fields([(b"k1", {"a": b"1"}), (b"k2", {"b": b"2"})], TTL)
            seen: list[str] = []
            async with asyncio.timeout(POLL_LIMIT):
                while not seen or seen[-1] != "EXEC":
                    command = (await monitor.next_command())["command"].split(" ")[0].upper()
                    if command in {"MULTI", "HSET", "PEXPIRE", "EXEC"}:
                        seen.append(command)
    finally:
        await backend.close()
        await raw.aclose()
    assert seen[0] == "MULTI"
    assert sorted(seen[1:-1]) == ["HSET", "HSET", "PEXPIRE", "PEXPIRE"]


async def test_delete_fields_and_hlen(backend: HashBackend) -> None:
    await backend.set_fields([(b"k", {"a": b"1", "b": b"2", "c": b"3"})], TTL)
    assert await backend.hlen(b"k") == 3
    await backend.delete_fields(b"k", ["a", "missing"])
    assert await backend.hlen(b"k") == 2
    await backend.delete_fields(b"k", ["b", "c"])
    assert await backend.scan(b"k") == {}
    assert await backend.hlen(b"k") == 0
    await backend.delete_fields(b"gone", ["x"])  # missing key: no error


async def test_scan_returns_every_field_of_a_large_hash(backend: HashBackend) -> None:
    fields = {str(i): str(i).encode() for i in range(1000)}  # several HSCAN pages
    await backend.set_fields([(b"big", fields)], TTL)
    assert await backend.scan(b"big") == fields


async def test_ping(backend: HashBackend) -> None:
    await backend.ping()


async def test_closed_memory_backend_fails() -> None:
    backend = MemoryBackend()
    await backend.close()
    with pytest.raises(ConnectionError):
        await backend.ping()
    with pytest.raises(ConnectionError):
        await backend.scan(b"k")


# --- ExpiringHash: expiry, pruning, GC ----------------------------------------------------------------------------


async def test_set_and_scan_payloads(backend: HashBackend) -> None:
    clock = FakeClock()
    hashes: ExpiringHash[int] = ExpiringHash(backend, TTL, by_agent, clock=clock)
    await hashes.set(1, "conn-1", b"payload-1")
    await hashes.set_many([(1, "conn-2", b"payload-2"), (2, "conn-3", b"payload-3")])

    assert await hashes.scan(1) == {"conn-1": b"payload-1", "conn-2": b"payload-2"}
    assert await hashes.scan(2) == {"conn-3": b"payload-3"}
    assert await hashes.scan(3) == {}
    assert hashes.owned_count() == 3
    stored = ExpiringValue.FromString((await backend.scan(by_agent(1)))["conn-1"])
    assert stored.value == b"payload-1"
    assert stored.expires_at >= clock.now + TTL


async def test_expired_fields_are_hidden_and_pruned_lazily(backend: HashBackend) -> None:
    clock = FakeClock()
    writer: ExpiringHash[int] = ExpiringHash(backend, TTL, by_agent, clock=clock)
    await writer.set(1, "old", b"x")
    clock.advance(TTL / 2)
    await writer.set(1, "new", b"y")  # writes only "new": "old" keeps its first expiry

    clock.advance(TTL / 2 + 2)  # "old" expired, "new" still valid
    assert await writer.scan(1) == {"new": b"y"}
    assert set(await backend.scan(by_agent(1))) == {"new"}, "the expired field must have been deleted by the scan"


async def test_undecodable_values_are_skipped_and_kept(backend: HashBackend) -> None:
    hashes: ExpiringHash[int] = ExpiringHash(backend, TTL, by_agent)
    await hashes.set(1, "good", b"ok")
    await backend.set_fields([(by_agent(1), {"bad": b"\xff\xff\xff"})], TTL)

    assert await hashes.scan(1) == {"good": b"ok"}
    assert await hashes.gc() == 0
    assert "bad" in await backend.scan(by_agent(1)), "undecodable values are reported, never deleted"


async def written_then_seen(write: Callable[[float], Awaitable[None]], seen: Callable[[], Awaitable[bool]]) -> float:
    """Write with a short TTL and see the write before it may expire; returns the TTL used (seconds).

    An expiry test must first see what expires, or it passes when nothing was written. Not seeing it within its
    TTL fails; when the TTL may have passed before the first look (a loaded machine), the write is tried again
    with a TTL four times longer.
    """
    ttl = 0.3
    while True:
        began = time.monotonic()
        await write(ttl)
        if await seen():
            return ttl
        waited = time.monotonic() - began
        assert waited >= ttl, f"not there {waited:.2f} s after the write (TTL {ttl} s): it was never written"
        assert ttl < 20, "this machine is too slow to see a write before its TTL passes"
        ttl *= 4


async def test_key_expires_after_ttl_without_refresh(backend: HashBackend) -> None:
    async def write(ttl: float) -> None:
        await ExpiringHash(backend, ttl, by_agent).set(1, "f", b"v")

    async def present() -> bool:
        return await backend.hlen(by_agent(1)) == 1

    async def gone() -> bool:
        return await backend.scan(by_agent(1)) == {}

    ttl = await written_then_seen(write, present)
    await poll(gone, f"key-level expiry (PEXPIRE {ttl * 1000:.0f} ms)")


async def test_killed_kas_data_expires_by_itself(store: Store) -> None:
    survivor: ExpiringHash[int] = ExpiringHash(store.backend, TTL, by_agent)
    await survivor.set(8, "grpc://kas-2:8155", b"")

    async def write(ttl: float) -> None:
        # Dropped without clear() right after the write: the process died.
        await ExpiringHash(store.peer(), ttl, by_agent).set(7, "grpc://kas-1:8155", b"")

    async def present() -> bool:
        return await survivor.scan(7) == {"grpc://kas-1:8155": b""}

    async def expired() -> bool:
        return await survivor.scan(7) == {} and await store.backend.scan(by_agent(7)) == {}

    await written_then_seen(write, present)
    await poll(expired, "expiry of a killed kas' data")
    assert await survivor.scan(8) == {"grpc://kas-2:8155": b""}


async def test_gc_deletes_expired_fields_of_other_writers(store: Store) -> None:
    clock = FakeClock()
    stale_clock = FakeClock()
    stale_clock.advance(-2 * TTL)  # a kas whose entries expired long ago (it stopped refreshing)
    live: ExpiringHash[int] = ExpiringHash(store.backend, TTL, by_agent, clock=clock)
    stale: ExpiringHash[int] = ExpiringHash(store.peer(), TTL, by_agent, clock=stale_clock)
    await stale.set_many([(1, "s1", b""), (1, "s2", b""), (2, "s3", b"")])
    await live.set(1, "l1", b"")

    assert await live.gc() == 2, "only keys the GCing kas owns are visited (kas.md §3.1)"
    assert set(await store.backend.scan(by_agent(1))) == {"l1"}
    assert set(await store.backend.scan(by_agent(2))) == {"s3"}
    assert await live.gc() == 0


async def test_gc_retries_once_after_a_watch_conflict(store: Store) -> None:
    calls = 0

    async def concurrent_writer(key: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # someone writes the key between the scan and EXEC: the transaction must abort
            await gc_backend.set_fields([(key, {"fresh": b"x"})], TTL)

    gc_backend = store.with_gc_hook(concurrent_writer)
    stale_clock = FakeClock()
    stale_clock.advance(-2 * TTL)
    stale: ExpiringHash[int] = ExpiringHash(gc_backend, TTL, by_agent, clock=stale_clock)
    await stale.set_many([(1, "old1", b""), (1, "old2", b"")])

    assert await gc_backend.gc(by_agent(1), time.time()) == 2
    assert calls == 2, "the first attempt conflicted, the second committed"
    assert set(await gc_backend.scan(by_agent(1))) == {"fresh"}, "the concurrent write survives"


async def test_gc_gives_up_after_two_conflicts(store: Store) -> None:
    calls = 0

    async def always_conflicting(key: bytes) -> None:
        nonlocal calls
        calls += 1
        await gc_backend.set_fields([(key, {f"fresh{calls}": b"x"})], TTL)

    gc_backend = store.with_gc_hook(always_conflicting)
    stale_clock = FakeClock()
    stale_clock.advance(-2 * TTL)
    stale: ExpiringHash[int] = ExpiringHash(gc_backend, TTL, by_agent, clock=stale_clock)
    await stale.set(1, "old", b"")

    assert await gc_backend.gc(by_agent(1), time.time()) == 0
    assert calls == 2
    assert set(await gc_backend.scan(by_agent(1))) == {"old", "fresh1", "fresh2"}


# --- ExpiringHash: refresh, shutdown ------------------------------------------------------------------------------


async def test_refresh_extends_field_expiry(backend: HashBackend) -> None:
    clock = FakeClock()
    hashes: ExpiringHash[int] = ExpiringHash(backend, TTL, by_agent, clock=clock)
    await hashes.set_many([(1, "a", b"1"), (2, "b", b"2")])
    clock.advance(TTL - 1)
    assert await hashes.refresh() == 2
    clock.advance(2)  # past the original expiry, before the refreshed one
    assert await hashes.scan(1) == {"a": b"1"}
    assert await hashes.scan(2) == {"b": b"2"}


async def test_refresh_rebuilds_after_data_loss(store: Store) -> None:
    hashes: ExpiringHash[int] = ExpiringHash(store.backend, TTL, by_agent)
    await hashes.set_many([(1, "a", b"1"), (1, "b", b"2"), (2, "c", b"3")])
    await store.wipe()  # Redis restarted without persistence
    assert await hashes.scan(1) == {}

    assert await hashes.refresh() == 3
    assert await hashes.scan(1) == {"a": b"1", "b": b"2"}
    assert await hashes.scan(2) == {"c": b"3"}
    first, second = await store.expire_time_ms(by_agent(1)), await store.expire_time_ms(by_agent(2))
    assert first > 0
    assert abs(first - second) <= 1, "one refresh transaction gives every key one expiry"


async def test_unset_deletes_and_forget_lets_expire(backend: HashBackend) -> None:
    hashes: ExpiringHash[int] = ExpiringHash(backend, TTL, by_agent)
    await hashes.set_many([(1, "a", b""), (1, "b", b""), (1, "c", b"")])
    await hashes.unset(1, "a")
    hashes.forget(1, "b")
    assert set(await backend.scan(by_agent(1))) == {"b", "c"}, "forget does not touch the backend"
    assert hashes.owned_fields(1) == {"c"}

    await backend.delete_fields(by_agent(1), ["b", "c"])
    assert await hashes.refresh() == 1
    assert set(await backend.scan(by_agent(1))) == {"c"}, "forgotten fields are not refreshed"


async def test_clear_removes_only_own_fields(store: Store) -> None:
    mine: ExpiringHash[int] = ExpiringHash(store.backend, TTL, by_agent)
    theirs: ExpiringHash[int] = ExpiringHash(store.peer(), TTL, by_agent)
    await mine.set_many([(1, "grpc://kas-1", b""), (2, "grpc://kas-1", b"")])
    await theirs.set(1, "grpc://kas-2", b"")

    assert await mine.clear() == 2
    assert mine.owned_count() == 0
    assert set(await store.backend.scan(by_agent(1))) == {"grpc://kas-2"}
    assert await store.backend.scan(by_agent(2)) == {}
    assert await mine.refresh() == 0


async def test_run_every_survives_failures(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("backend down")

    async def called_again() -> bool:
        return calls >= 3

    with caplog.at_level(logging.ERROR, logger="tether.tool.expiring_hash"):
        async with running(run_every(0.01, flaky, "flaky action")):
            await poll(called_again, "periodic action after a failure")
    assert "flaky action failed" in caplog.text


# --- Event bus --------------------------------------------------------------------------------------------------------


async def test_events_reach_every_bus_including_the_publisher(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus_a = await started_bus(store.backend, stack)
        bus_b = await started_bus(store.peer(), stack)
        assert bus_a.channel == "gitlab-kas:kas_events"
        received_a: list[GitPushEvent] = []
        bus_a.on(GitPushEvent, received_a.append)

        with bus_a.listen(GitPushEvent) as at_a, bus_b.listen(GitPushEvent) as at_b:
            event = GitPushEvent()
            event.project.id = 5
            event.project.full_path = "group/project"
            await bus_a.publish(event)
            assert await at_a.get(POLL_LIMIT) == event
            assert await at_b.get(POLL_LIMIT) == event
        assert received_a == [event]


async def test_failing_listener_does_not_stop_the_bus(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus = await started_bus(store.backend, stack)

        def broken(_event: GitPushEvent) -> None:
            raise RuntimeError("listener bug")

        bus.on(GitPushEvent, broken)
        with bus.listen(GitPushEvent) as events:
            await bus.publish(GitPushEvent())
            await bus.publish(GitPushEvent())
            await events.get(POLL_LIMIT)
            await events.get(POLL_LIMIT)


async def test_agent_tracker_publishes_connect_and_disconnect(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus = await started_bus(store.backend, stack)
        remote_bus = await started_bus(store.peer(), stack)
        tracker = AgentTracker(store.backend, bus, PREFIX, ttl=EntryTtl(TTL))
        info = agent_info(agent_id=3, connection_id=11, project_id=30)

        with remote_bus.listen(AgentConnected) as connected, remote_bus.listen(AgentDisconnected) as disconnected:
            await tracker.register_connection(info)
            assert (await connected.get(POLL_LIMIT)).info == info
            await tracker.unregister_connection(info)
            assert (await disconnected.get(POLL_LIMIT)).info == info


async def test_wait_for_tunnels_of_one_agent(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus = await started_bus(store.backend, stack)
        kas2 = TunnelTracker(
            store.peer(), await started_bus(store.peer(), stack), "grpc://kas-2:8155", ttl=EntryTtl(TTL)
        )
        local = TunnelTracker(store.backend, bus, "grpc://kas-1:8155", ttl=EntryTtl(TTL))

        # The routing pattern: listen first, then query, then wait, so nothing is missed in between.
        with bus.listen(TunnelsAvailable, lambda event: event.agent_id == 9) as tunnels:
            assert await local.kas_urls(9) == []
            await kas2.register(8)  # another agent: filtered out
            await kas2.register(9)
            event = await tunnels.get(POLL_LIMIT)
        assert (event.agent_id, event.kas_url) == (9, "grpc://kas-2:8155")
        assert await local.kas_urls(9) == ["grpc://kas-2:8155"]

        with pytest.raises(TimeoutError):
            await bus.wait_for(TunnelsAvailable, lambda event: event.agent_id == 10, timeout_s=0.2)


async def test_subscription_ends_when_backend_closes(store: Store) -> None:
    backend = store.peer() if store.url is not None else MemoryBackend()
    bus = EventBus(backend, PREFIX)
    task = asyncio.create_task(bus.run())
    try:
        async with asyncio.timeout(POLL_LIMIT):
            await bus.wait_subscribed()
        await backend.close()
        async with asyncio.timeout(POLL_LIMIT):
            await task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def restartable_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisServer]:
    """A dedicated redis-server this test may stop and start again on the same port."""
    server = RedisServer(tmp_path / "redis").start()
    # After a stop, the closed connections linger (TIME_WAIT/FIN_WAIT) on the server port; redis-server binds with
    # SO_REUSEADDR and starts fine, but the fixture's plain-bind pre-check would refuse the port.
    monkeypatch.setattr(redis_server_module, "ensure_port_free", lambda *_args, **_kwargs: None)
    try:
        yield server
    finally:
        server.stop()


async def test_subscription_survives_a_redis_restart(restartable_redis: RedisServer) -> None:
    backend = RedisBackend.from_url(restartable_redis.url)
    try:
        async with contextlib.AsyncExitStack() as stack:
            bus = await started_bus(backend, stack)
            tracker = TunnelTracker(backend, bus, "grpc://kas-1:8155", ttl=EntryTtl(TTL))
            await tracker.register(4)

            restartable_redis.stop()
            restartable_redis.start()  # same port, empty data set

            async with asyncio.timeout(15):
                await bus.wait_subscribed(2)  # re-subscribed on the new server
            # Pooled connections died with the old server: the command retry makes this first write succeed.
            assert await tracker.refresh() == 1
            with bus.listen(TunnelsAvailable) as tunnels:
                await bus.publish(TunnelsAvailable(agent_id=4, kas_url="grpc://kas-1:8155"))
                assert (await tunnels.get(POLL_LIMIT)).agent_id == 4
            assert await tracker.kas_urls(4) == ["grpc://kas-1:8155"], "refresh rebuilt the lost registration"
    finally:
        await backend.close()


# --- Agent tracker ----------------------------------------------------------------------------------------------------


async def test_agent_tracker_queries_by_agent_and_project(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        kas1 = AgentTracker(store.backend, await started_bus(store.backend, stack), PREFIX, ttl=EntryTtl(TTL))
        kas2 = AgentTracker(store.peer(), await started_bus(store.peer(), stack), PREFIX, ttl=EntryTtl(TTL))
        pod1 = agent_info(agent_id=1, connection_id=101, project_id=10)
        pod2 = agent_info(agent_id=1, connection_id=102, project_id=10)  # second replica of agent 1, on kas2
        other = agent_info(agent_id=2, connection_id=201, project_id=10)
        await kas1.register_connection(pod1)
        await kas2.register_connection(pod2)
        await kas1.register_connection(other)

        assert await kas1.connections_by_agent_id(1) == [pod1, pod2]
        assert await kas2.connections_by_project_id(10) == [pod1, pod2, other]
        assert await kas1.connections_by_agent_id(3) == []
        assert await kas1.connected_agent_count() == 2

        await kas1.unregister_connection(pod1)
        assert await kas2.connections_by_agent_id(1) == [pod2]
        assert await kas2.connections_by_project_id(10) == [pod2, other]
        assert await kas1.connected_agent_count() == 2, "connected_agents entries expire, they are not deleted"

        assert await kas2.clear() == 3
        assert await kas1.connections_by_agent_id(1) == []
        assert await kas1.connections_by_project_id(10) == [other]


async def test_agent_tracker_names_the_kas_replica_of_each_connection(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        kas1 = AgentTracker(
            store.backend,
            await started_bus(store.backend, stack),
            PREFIX,
            ttl=EntryTtl(TTL),
            kas_url="grpc://kas-1:8155",
        )
        kas2 = AgentTracker(
            store.peer(), await started_bus(store.peer(), stack), PREFIX, ttl=EntryTtl(TTL), kas_url="grpc://kas-2:8155"
        )
        upstream = AgentTracker(store.peer(), await started_bus(store.peer(), stack), PREFIX, ttl=EntryTtl(TTL))
        await kas1.register_connection(agent_info(agent_id=1, connection_id=101, project_id=10))
        await kas2.register_pod(agent_info(agent_id=1, connection_id=102, project_id=10))
        await upstream.register_connection(agent_info(agent_id=1, connection_id=103, project_id=10))

        found = {info.connection_id: info.kas_url for info in await kas1.connections_by_agent_id(1)}
        assert found == {101: "grpc://kas-1:8155", 102: "grpc://kas-2:8155", 103: ""}
        by_project = {info.connection_id: info.kas_url for info in await kas2.connections_by_project_id(10)}
        assert by_project == found


async def test_agent_tracker_keeps_connected_agent_while_a_connection_remains(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        tracker = AgentTracker(store.backend, await started_bus(store.backend, stack), PREFIX, ttl=EntryTtl(TTL))
        pod1, pod2 = agent_info(5, 1, 50), agent_info(5, 2, 50)
        await tracker.register_connection(pod1)
        await tracker.register_connection(pod2)
        await tracker.unregister_connection(pod1)
        await store.wipe()
        assert await tracker.refresh() == 3, "pod2 in both indexes plus the connected_agents field"
        await tracker.unregister_connection(pod2)
        assert await tracker.refresh() == 0
        assert await tracker.connected_agent_count() == 1, "forgotten, left to expire"


async def test_agent_tracker_key_layout(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        tracker = AgentTracker(store.backend, await started_bus(store.backend, stack), "tether-test", ttl=EntryTtl(TTL))
        info = agent_info(agent_id=42, connection_id=-7, project_id=2**40)
        await tracker.register_connection(info)

    by_agent_key = b"tether-test:agent_tracker2:conn_by_agent_id:" + struct.pack("<q", 42)
    by_project_key = b"tether-test:agent_tracker2:conn_by_project_id:" + struct.pack("<q", 2**40)
    connected_key = b"tether-test:agent_tracker2:connected_agents"
    assert tracker.agent_key(42) == by_agent_key
    for key in (by_agent_key, by_project_key):
        stored = await store.backend.scan(key)
        assert list(stored) == ["-7"]
        assert ConnectedAgentInfo.FromString(ExpiringValue.FromString(stored["-7"]).value) == info
    connected = await store.backend.scan(connected_key)
    assert list(connected) == ["42"]
    assert ExpiringValue.FromString(connected["42"]).value == b""
    if store.raw is not None:
        assert set(await store.raw.keys("*")) == {by_agent_key, by_project_key, connected_key}
        assert await store.raw.hget(by_agent_key, "-7") is not None


async def test_agent_tracker_run_refreshes_and_rebuilds(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus = await started_bus(store.backend, stack)
        tracker = AgentTracker(store.backend, bus, PREFIX, ttl=EntryTtl(TTL, 0.05, 0.05))
        info = agent_info(6, 60, 600)
        await tracker.register_connection(info)
        await stack.enter_async_context(running(tracker.run()))
        await store.wipe()  # Redis restarted mid-test

        async def rebuilt() -> bool:
            return await tracker.connections_by_agent_id(6) == [info] and await tracker.connected_agent_count() == 1

        await poll(rebuilt, "rebuild by the refresh loop")
    await tracker.clear()
    assert await tracker.connections_by_project_id(600) == []


# --- Tunnel tracker and kas instances ---------------------------------------------------------------------------------


async def test_tunnel_tracker_with_two_kas(store: Store) -> None:
    async with contextlib.AsyncExitStack() as stack:
        kas1 = TunnelTracker(
            store.backend, await started_bus(store.backend, stack), "grpc://10.0.0.1:8155", ttl=EntryTtl(TTL)
        )
        kas2 = TunnelTracker(
            store.peer(), await started_bus(store.peer(), stack), "grpc://10.0.0.2:8155", ttl=EntryTtl(TTL)
        )
        await kas1.register(1)
        await kas2.register(1)
        await kas2.register(2)

        assert await kas1.kas_urls(1) == ["grpc://10.0.0.1:8155", "grpc://10.0.0.2:8155"]
        assert await kas1.kas_urls(2) == ["grpc://10.0.0.2:8155"]
        assert kas2.registered_agents() == {1, 2}

        await kas1.unregister(1)
        assert await kas2.kas_urls(1) == ["grpc://10.0.0.2:8155"]
        assert await kas2.clear() == 2
        assert await kas1.kas_urls(1) == []
        assert await kas1.kas_urls(2) == []

    key = b"gitlab-kas:tunnel_tracker2:kas_by_agent_id:" + struct.pack("<q", 1)
    assert kas1.agent_key(1) == key
    await kas1.register(1)
    stored = await store.backend.scan(key)
    assert list(stored) == ["grpc://10.0.0.1:8155"]
    assert ExpiringValue.FromString(stored["grpc://10.0.0.1:8155"]).value == b""


async def test_tunnels_available_goes_out_in_the_tracker_write(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 items 3 and 5: ``TunnelsAvailable`` is part of the tracker write's transaction, not a round trip after
    it; another kas (its own connection, for Redis) reads the entry the event announces."""
    async with contextlib.AsyncExitStack() as stack:
        bus = await started_bus(store.backend, stack)
        other = store.peer()
        peer = TunnelTracker(other, await started_bus(other, stack), "grpc://kas-1:8155", ttl=EntryTtl(TTL))
        tracker = TunnelTracker(store.backend, bus, "grpc://kas-2:8155", ttl=EntryTtl(TTL))

        async def no_round_trip(channel: str, payload: bytes) -> None:
            raise AssertionError("TunnelsAvailable was published apart from the tracker write")

        monkeypatch.setattr(store.backend, "publish", no_round_trip)
        with bus.listen(TunnelsAvailable, lambda event: event.agent_id == 12) as tunnels:
            await tracker.register(12)
            event = await tunnels.get(POLL_LIMIT)
        assert event.kas_url == "grpc://kas-2:8155"
        assert await peer.kas_urls(12) == ["grpc://kas-2:8155"]


async def test_publish_runs_inside_the_write_transaction_on_redis(redis_url: str) -> None:
    """Redis only (MONITOR): the announcement is a command of the write's ``MULTI/EXEC``, after the writes."""
    backend = RedisBackend.from_url(redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with raw.monitor() as monitor:
            await backend.set_fields([(b"k1", {"a": b"1"})], TTL, [("test:events", b"hello")])
            seen: list[str] = []
            async with asyncio.timeout(POLL_LIMIT):
                while not seen or seen[-1] != "EXEC":
                    command = (await monitor.next_command())["command"].split(" ")[0].upper()
                    if command in {"MULTI", "HSET", "PEXPIRE", "PUBLISH", "EXEC"}:
                        seen.append(command)
    finally:
        await backend.close()
        await raw.aclose()
    assert seen == ["MULTI", "HSET", "PEXPIRE", "PUBLISH", "EXEC"]


async def test_tunnel_tracker_expired_entries_are_not_listed(backend: HashBackend) -> None:
    async with contextlib.AsyncExitStack() as stack:
        bus = await started_bus(backend, stack)

        async def write(ttl: float) -> None:
            await TunnelTracker(backend, bus, "grpc://kas-1:8155", ttl=EntryTtl(ttl)).register(1)

        async def listed() -> bool:
            return await TunnelTracker(backend, bus, "grpc://kas-2:8155").kas_urls(1) == ["grpc://kas-1:8155"]

        async def expired() -> bool:
            return await TunnelTracker(backend, bus, "grpc://kas-2:8155").kas_urls(1) == []

        await written_then_seen(write, listed)
        await poll(expired, "expiry of a tunnel registration")


async def test_kas_instance_registry(store: Store) -> None:
    kas1, kas2 = (
        KasInstanceRegistry(store.backend, ttl=EntryTtl(TTL)),
        KasInstanceRegistry(store.peer(), ttl=EntryTtl(TTL)),
    )
    info1 = KasInstanceInfo(version="v1", commit="abc", private_api_url="grpc://10.0.0.1:8155")
    info1.started_at.FromSeconds(1_700_000_000)
    info2 = KasInstanceInfo(version="v1", commit="abc", private_api_url="grpc://10.0.0.2:8155")
    await kas1.register(info1)
    await kas2.register(info2)
    assert kas1.key == b"gitlab-kas:kas_instances"
    assert await kas1.instances() == [info1, info2]

    await store.wipe()
    assert await kas2.instances() == []
    assert await kas1.refresh() == 1
    assert await kas2.refresh() == 1
    assert await kas2.instances() == [info1, info2]

    assert await kas1.clear() == 1
    assert await kas2.instances() == [info2]
    with pytest.raises(ValueError, match="private_api_url"):
        await kas1.register(KasInstanceInfo())
