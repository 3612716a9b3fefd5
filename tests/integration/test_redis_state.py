"""Redis state that cannot leak or fail all at once (issue 9 item 3), on real Redis.

Failed registrations leave nothing, unregistration is one transaction, refresh runs in bounded pipelines
without blocking registrations, entries of a dead kas are collected, the connection pool waits instead of
failing, and 20,000 simulated connections refresh while a routed call's Redis reads stay fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
import redis.exceptions

from tether.kas.instance_registry import KasInstanceRegistry
from tether.modserver.agent_tracker import AgentTracker
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.kas.instance_pb2 import KasInstanceInfo
from tether.tool.backoff import Backoff
from tether.tool.events import EventBus
from tether.tool.expiring_hash import REFRESH_BATCH_KEYS, WRITE_BATCH_ITEMS, EntryTtl, ExpiringHash
from tether.tool.memory import freeze_startup_heap, space_full_collections
from tether.tool.redis_backend import RedisBackend
from tether.tool.supervisor import supervise
from tether.tunnel.server.kas_pool import KasPool
from tether.tunnel.server.tracker import TunnelTracker
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer

pytestmark = pytest.mark.redis
PREFIX = "t9b"


@pytest.fixture
async def backend(redis_url: str) -> AsyncIterator[RedisBackend]:
    created = RedisBackend.from_url(redis_url)
    try:
        yield created
    finally:
        await created.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def connection(agent_id: int, connection_id: int, project_id: int = 7) -> ConnectedAgentInfo:
    return ConnectedAgentInfo(agent_id=agent_id, connection_id=connection_id, project_id=project_id)


async def test_failed_registration_leaves_no_ghost() -> None:
    """A registration whose writes all fail is not kept in memory and refreshed forever."""
    dead = RedisBackend.from_url(f"redis://127.0.0.1:{free_port()}/0", dial_timeout_s=0.2, pool_timeout_s=0.2)
    try:
        state: ExpiringHash[int] = ExpiringHash(dead, 60, lambda key: b"k%d" % key)
        with pytest.raises(redis.exceptions.ConnectionError, match=r"connecting to 127\.0\.0\.1"):
            await state.set(1, "field", b"value")
        assert state.owned_count() == 0
        assert await state.refresh() == 0
    finally:
        await dead.close()


async def test_registrations_in_a_storm_share_transactions(backend: RedisBackend) -> None:
    """Registrations made while a write is in flight go out together (group commit), each one whole, in bounded
    transactions: 10,000 agents connecting must not queue one Redis round trip each behind the lock (issue 9)."""
    state: ExpiringHash[int] = ExpiringHash(backend, 60, lambda key: f"{PREFIX}:g:{key}".encode())
    sizes: list[int] = []
    write = backend.set_fields

    async def counting(writes: Any, ttl_s: float, *announce: Any) -> None:
        sizes.append(sum(len(fields) for _, fields in writes))
        await write(writes, ttl_s, *announce)

    backend.set_fields = counting  # type: ignore[method-assign]
    await asyncio.gather(*(state.set_many([(n, "a", b"%d" % n), (n, "b", b"x")]) for n in range(1_000)))
    assert len(sizes) < 1_000 / 10 and max(sizes) <= WRITE_BATCH_ITEMS and sum(sizes) == 2_000
    assert state.owned_count() == 2_000
    for n in (0, 499, 999):
        assert await state.scan(n) == {"a": b"%d" % n, "b": b"x"}


async def test_a_cancelled_registration_is_given_up_and_a_failed_batch_fails_every_caller() -> None:
    dead = RedisBackend.from_url(f"redis://127.0.0.1:{free_port()}/0", dial_timeout_s=0.2, pool_timeout_s=0.2)
    try:
        state: ExpiringHash[int] = ExpiringHash(dead, 60, lambda key: b"k%d" % key)
        calls = [asyncio.create_task(state.set(n, "f", b"v")) for n in range(20)]
        await asyncio.sleep(0)
        calls[5].cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[5], asyncio.CancelledError)
        assert all(isinstance(result, Exception) for n, result in enumerate(results) if n != 5)
        assert state.owned_count() == 0
    finally:
        await dead.close()


async def test_a_caller_cancelled_during_its_write_does_not_keep_the_registration(backend: RedisBackend) -> None:
    state: ExpiringHash[int] = ExpiringHash(backend, 60, lambda key: f"{PREFIX}:c:{key}".encode())
    first = asyncio.create_task(state.set(1, "f", b"v"))
    second = asyncio.create_task(state.set(2, "f", b"v"))
    await asyncio.sleep(0)  # both queued; the write of the first is under way
    first.cancel()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert state.owned_keys() == [2]  # the cancelled one is not refreshed: it expires by itself


async def test_publications_in_a_storm_share_round_trips_and_keep_their_order(backend: RedisBackend) -> None:
    """Every agent that connects announces itself: 1,000 events published at once arrive whole and in order,
    sent in a few pipelines instead of a round trip each (issue 9)."""
    client = backend.client
    pipelines = 0
    make_pipeline = client.pipeline

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal pipelines
        pipelines += 1
        return make_pipeline(*args, **kwargs)

    subscribed = asyncio.Event()
    received: list[bytes] = []

    async def listen() -> None:
        async for payload in backend.subscribe(f"{PREFIX}:storm", subscribed.set):
            received.append(payload)
            if len(received) == 1_000:
                return

    listener = asyncio.create_task(listen())
    async with asyncio.timeout(10):
        await subscribed.wait()
        client.pipeline = counting  # type: ignore[method-assign]
        await asyncio.gather(*(backend.publish(f"{PREFIX}:storm", b"%d" % n) for n in range(1_000)))
        await listener
    assert received == [b"%d" % n for n in range(1_000)]
    assert pipelines < 1_000 / 10


async def test_unregistration_is_one_transaction(backend: RedisBackend, raw: aioredis.Redis) -> None:
    tracker = AgentTracker(backend, EventBus(backend, PREFIX), PREFIX, EntryTtl(60, 50, 600))
    info = connection(41, 4101)
    await tracker.register_connection(info)
    seen: list[str] = []
    async with raw.monitor() as monitor:
        await tracker.unregister_connection(info)
        async with asyncio.timeout(5):
            while not seen or seen[-1] != "EXEC":
                command = (await monitor.next_command())["command"].split(" ")[0].upper()
                if command in {"MULTI", "HDEL", "EXEC"}:
                    seen.append(command)
    assert seen == ["MULTI", "HDEL", "HDEL", "EXEC"]
    assert await tracker.connections_by_agent_id(41) == []
    assert await tracker.connections_by_project_id(7) == []


async def test_refresh_runs_in_bounded_batches_and_never_resurrects(backend: RedisBackend, raw: aioredis.Redis) -> None:
    state: ExpiringHash[int] = ExpiringHash(backend, 60, lambda key: f"{PREFIX}:b:{key}".encode())
    await state.set_many([(key, "f", b"v") for key in range(3 * REFRESH_BATCH_KEYS)])
    batch_sizes: list[int] = []
    async with raw.monitor() as monitor:
        refresh = asyncio.create_task(state.refresh())
        await asyncio.sleep(0)
        # While the refresh is under way: a registration goes through, and an unset one must stay unset.
        await state.unset(1, "f")
        await state.set(10_000, "f", b"new")
        assert not refresh.done() or await refresh == 3 * REFRESH_BATCH_KEYS
        await refresh
        size = 0
        async with asyncio.timeout(10):
            while len(batch_sizes) < 3:
                command = (await monitor.next_command())["command"].split(" ")[0].upper()
                if command == "MULTI":
                    size = 0
                elif command in {"HSET", "PEXPIRE"}:
                    size += 1
                elif command == "EXEC" and size > 2:
                    batch_sizes.append(size)
    assert max(batch_sizes) <= 2 * REFRESH_BATCH_KEYS
    assert await state.scan(1) == {}
    assert await state.scan(10_000) == {"f": b"new"}


async def test_entries_of_a_dead_kas_are_collected(backend: RedisBackend, raw: aioredis.Redis) -> None:
    """A kas killed without clean-up: its fields expire, and the survivor's GC deletes them from shared keys."""
    dead_tunnels = TunnelTracker(backend, EventBus(backend, PREFIX), "grpc://dead:1", PREFIX, ttl=EntryTtl(1))
    live_tunnels = TunnelTracker(backend, EventBus(backend, PREFIX), "grpc://live:1", PREFIX, ttl=EntryTtl(60))
    dead_instances = KasInstanceRegistry(backend, PREFIX, ttl=EntryTtl(1))
    live_instances = KasInstanceRegistry(backend, PREFIX, ttl=EntryTtl(60))
    await dead_tunnels.register(5)
    await live_tunnels.register(5)
    await dead_instances.register(KasInstanceInfo(private_api_url="grpc://dead:1"))
    await live_instances.register(KasInstanceInfo(private_api_url="grpc://live:1"))
    await asyncio.sleep(2.1)  # the dead kas never refreshes again
    assert await live_tunnels.gc() == 1
    assert await live_instances.gc() == 1
    assert set(await raw.hkeys(live_tunnels.agent_key(5))) == {b"grpc://live:1"}
    assert set(await raw.hkeys(live_instances.key)) == {b"grpc://live:1"}


async def test_pool_waits_for_a_connection_instead_of_failing(redis_url: str) -> None:
    """Far more concurrent commands than pooled connections (tracker writes, routed reads, events): none fails."""
    small = RedisBackend.from_url(redis_url, pool_size=8)
    try:
        commands = [
            *(small.set_fields([(b"%s:p:%d" % (PREFIX.encode(), n), {"f": b"v"})], 60) for n in range(1_000)),
            *(small.scan(b"%s:p:%d" % (PREFIX.encode(), n)) for n in range(1_000)),
            *(small.publish(f"{PREFIX}:events", b"x") for _ in range(500)),
        ]
        results = await asyncio.gather(*commands, return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
    finally:
        await small.close()


async def test_channels_to_departed_kas_are_closed() -> None:
    pool = KasPool(b"s" * 32, None, 1 << 20)
    try:
        gone = f"grpc://127.0.0.1:{free_port()}"
        channel = pool.channel(gone)
        with pytest.raises(grpc.aio.AioRpcError):
            await channel.unary_unary("/x.Y/Z")(b"", timeout=1)
        assert await pool.close_unused(idle_s=0) == [gone]
        assert pool.urls == []
    finally:
        await pool.close()


async def test_crashed_background_loop_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    third = asyncio.Event()

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("boom")
        third.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(supervise("flaky", flaky, backoff=Backoff(initial_s=0.01, max_s=0.01)))
    try:
        await asyncio.wait_for(third.wait(), 5)
    finally:
        task.cancel()
    assert sum("background loop flaky crashed" in r.getMessage() for r in caplog.records) == 2


@contextlib.contextmanager
def kas_collector() -> Iterator[None]:
    """The garbage collector as kas sets it once started: start-up heap frozen, full collections spaced.

    Without it, the routed reads below measured pytest's own full collections (100-170 ms each, over every
    fixture's objects), not Redis or kas.
    """
    threshold = gc.get_threshold()
    freeze_startup_heap()
    space_full_collections()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


async def test_20000_connections_refresh_while_routed_reads_stay_fast(backend: RedisBackend) -> None:
    """20,000 simulated agent connections (agent tracker + tunnel tracker) register and refresh on real Redis;
    a routed call's read of the tunnel tracker meanwhile is served between the refresh's transactions, never
    behind the whole refresh (counted in refresh transactions, not in milliseconds)."""
    with kas_collector():
        await _refresh_20000_connections(backend)


async def _refresh_20000_connections(backend: RedisBackend) -> None:
    events = EventBus(backend, PREFIX)
    agents = AgentTracker(backend, events, PREFIX, EntryTtl(300, 240, 600))
    tunnels = TunnelTracker(backend, events, "grpc://kas:1", PREFIX)
    count = 20_000
    semaphore = asyncio.Semaphore(1_000)

    async def connect(agent_id: int) -> None:
        async with semaphore:
            await agents.register_connection(connection(agent_id, agent_id * 10, agent_id % 500))
            await tunnels.register(agent_id)

    results = await asyncio.gather(*(connect(a) for a in range(1, count + 1)), return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []

    # Every write transaction of the refresh, counted as it completes.
    transactions = 0
    set_fields = backend.set_fields

    async def counted(*args: Any, **kwargs: Any) -> None:
        nonlocal transactions
        await set_fields(*args, **kwargs)
        transactions += 1

    backend.set_fields = counted  # type: ignore[method-assign]
    latencies: list[float] = []
    spans: list[int] = []  # refresh transactions completed while each read waited for its answer
    refreshing = True
    during_refresh = 0
    stop = asyncio.Event()

    async def routed_reads() -> None:
        # What a routing kas does for each request: read the tunnel tracker of the agent.
        nonlocal during_refresh
        while not stop.is_set():
            started, before = time.perf_counter(), transactions
            assert await tunnels.kas_urls(1 + len(latencies) % count) == ["grpc://kas:1"]
            latencies.append(time.perf_counter() - started)
            spans.append(transactions - before)
            during_refresh += refreshing
            await asyncio.sleep(0.005)

    reader = asyncio.create_task(routed_reads())
    started = time.perf_counter()
    written = await asyncio.gather(agents.refresh(), tunnels.refresh())
    refresh_s = time.perf_counter() - started
    refreshing = False
    stop.set()
    await reader
    backend.set_fields = set_fields  # type: ignore[method-assign]
    assert written == [3 * count, count]
    print(
        f"refresh of {count} connections: {refresh_s:.2f} s in {transactions} transactions; "
        f"{during_refresh} routed reads answered during it, each after at most {max(spans)} transactions; "
        f"routed read max {max(latencies) * 1000:.1f} ms"
    )
    # Bounded transactions (a few hundred keys each at most; 2 * count keys here) leave room for other commands...
    assert transactions >= 2 * count // 300, transactions
    # ...so routed reads are answered while the refresh runs, each behind a few of its transactions at most,
    # never behind the whole refresh. Both are counts: a loaded machine slows reads and refresh alike.
    assert during_refresh >= 10, f"only {during_refresh} routed reads were answered during the refresh"
    assert max(spans) <= transactions // 10, f"a routed read waited for {max(spans)} of {transactions} transactions"
    if bench_dir := os.environ.get("TETHER_BENCH_DIR"):  # bench/hardening.py collects the figures
        figures = {"refresh_s": refresh_s, "routed_read_max_ms": max(latencies) * 1000, "reads": len(latencies)}
        (Path(bench_dir) / "refresh_20000.json").write_text(json.dumps(figures))


async def test_subscription_is_back_within_seconds_of_a_long_redis_outage(tmp_path: Path) -> None:
    """The re-subscription triggers kas' re-write of its state: after 15 s down it must not wait another 10-20 s."""
    server = RedisServer(tmp_path / "redis").start()
    backend = RedisBackend.from_url(server.url, dial_timeout_s=0.5)
    subscribed: list[float] = []
    first, again = asyncio.Event(), asyncio.Event()

    def on_subscribed() -> None:
        subscribed.append(time.monotonic())
        (again if first.is_set() else first).set()

    async def consume() -> None:
        async for _ in backend.subscribe(f"{PREFIX}:outage", on_subscribed):
            pass

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(first.wait(), 10)
        port = server.port
        server.stop()
        await asyncio.sleep(15)
        server.port = port
        await asyncio.to_thread(server.start)
        back = time.monotonic()
        await asyncio.wait_for(again.wait(), 30)
        assert subscribed[-1] - back <= 3.0
    finally:
        task.cancel()
        await backend.close()
        server.stop()
