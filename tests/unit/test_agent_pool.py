"""Connection manager rules of kas.md §1.4, driven with fake connections and a fake clock (pure logic)."""

from __future__ import annotations

import asyncio

import pytest

from tether.tunnel.agent import pool as agent_pool
from tether.tunnel.agent.pool import ConnectionPool, PoolLimits, PoolStats, TunnelListener


class FakeConnection:
    """Runs until stopped; ``busy`` ones ignore ``stop`` (a call in flight) and only end on ``abort``."""

    def __init__(self, listener: TunnelListener, *, busy: bool = False, fail: bool = False) -> None:
        self.listener = listener
        self.busy = busy
        self.fail = fail
        self.stopped = False
        self.aborted = False
        self.ran = False
        self.running = asyncio.Event()
        self._ended = asyncio.Event()

    async def run(self) -> None:
        self.ran = True
        self.running.set()
        if self.fail:
            raise RuntimeError("loop crashed")
        await self._ended.wait()

    def stop(self) -> None:
        self.stopped = True
        if not self.busy:
            self._ended.set()

    def abort(self) -> None:
        self.aborted = True
        self._ended.set()


class Factory:
    def __init__(self) -> None:
        self.made: list[FakeConnection] = []
        self.busy = False
        self.fail = False

    def __call__(self, listener: TunnelListener) -> FakeConnection:
        connection = FakeConnection(listener, busy=self.busy, fail=self.fail)
        self.made.append(connection)
        return connection


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def live(factory: Factory) -> list[FakeConnection]:
    return [c for c in factory.made if not c.stopped]


async def test_starts_min_idle_connections() -> None:
    factory = Factory()
    pool = ConnectionPool(factory)
    pool.start()
    assert len(factory.made) == 2
    assert pool.stats == PoolStats(idle=2, active=0, total=2)
    await pool.stop()


async def test_scales_up_by_step_when_idle_drops_below_minimum() -> None:
    factory = Factory()
    pool = ConnectionPool(factory)
    pool.start()
    factory.made[0].listener.on_active()
    # idle 1 < 2: start min(10, 500 - 2) = 10 more
    assert len(factory.made) == 12
    assert pool.stats == PoolStats(idle=11, active=1, total=12)
    # Still 2+ idle after the next activation: no growth.
    factory.made[1].listener.on_active()
    assert pool.stats == PoolStats(idle=10, active=2, total=12)
    # A repeated on_active of the same connection changes nothing.
    factory.made[1].listener.on_active()
    assert pool.stats == PoolStats(idle=10, active=2, total=12)
    await pool.stop()


async def test_scale_up_is_capped_by_max_connections() -> None:
    factory = Factory()
    pool = ConnectionPool(factory, limits=PoolLimits(max_connections=15))
    pool.start()
    factory.made[0].listener.on_active()
    assert pool.stats.total == 12
    for connection in factory.made[1:11]:
        connection.listener.on_active()
    # idle 1 < 2 after the 11th activation: start min(10, 15 - 12) = 3
    assert pool.stats == PoolStats(idle=4, active=11, total=15)
    for connection in factory.made[11:]:
        connection.listener.on_active()
    assert pool.stats == PoolStats(idle=0, active=15, total=15)
    assert len(factory.made) == 15
    await pool.stop()


async def test_never_exceeds_500_connections() -> None:
    factory = Factory()
    pool = ConnectionPool(factory)
    pool.start()
    activated = 0
    while pool.stats.idle:
        factory.made[activated].listener.on_active()
        activated += 1
        assert pool.stats.total <= 500
    assert pool.stats == PoolStats(idle=0, active=500, total=500)
    assert len(factory.made) == 500
    # Returning to idle and becoming active again keeps the cap.
    factory.made[0].listener.on_idle()
    factory.made[0].listener.on_active()
    assert pool.stats == PoolStats(idle=0, active=500, total=500)
    assert len(factory.made) == 500
    await pool.stop()


async def test_extra_idle_connections_stop_after_max_idle_time() -> None:
    factory, clock = Factory(), Clock()
    pool = ConnectionPool(factory, clock=clock)
    pool.start()
    first = factory.made[0]
    first.listener.on_active()
    first.listener.on_idle()  # active -> idle, last active = now
    assert pool.stats == PoolStats(idle=12, active=0, total=12)

    clock.now += 30
    for connection in factory.made:
        connection.listener.on_idle()  # idle for 30 s only: kept
    assert pool.stats.idle == 12
    assert not any(c.stopped for c in factory.made)

    recent = factory.made[5]
    recent.listener.on_active()
    clock.now += 25
    recent.listener.on_idle()  # last active 25 s after the others

    clock.now += 6  # others idle for 61 s, `recent` for 6 s
    for connection in factory.made:
        connection.listener.on_idle()
    assert pool.stats == PoolStats(idle=2, active=0, total=2)
    assert not recent.stopped
    assert len(live(factory)) == 2
    # Idle connections never go below the minimum, however long they stay idle.
    clock.now += 3600
    for connection in live(factory):
        connection.listener.on_idle()
    assert pool.stats == PoolStats(idle=2, active=0, total=2)
    # Stopped connections' late reports change nothing.
    factory.made[1].listener.on_idle()
    factory.made[1].listener.on_active()
    assert pool.stats == PoolStats(idle=2, active=0, total=2)
    await pool.stop()


async def test_stop_gives_busy_connections_a_grace_period_then_aborts() -> None:
    factory = Factory()
    factory.busy = True
    pool = ConnectionPool(factory)
    pool.start()
    factory.made[0].listener.on_active()
    await pool.stop(grace_s=0.01)
    assert all(c.stopped for c in factory.made)
    # The ten of the scale-up were stopped before their start came round: nothing of theirs ran to abort.
    assert [c.aborted for c in factory.made] == [c.ran for c in factory.made] == [True, True] + [False] * 10
    assert pool.stats == PoolStats(idle=0, active=0, total=0)


async def test_scale_up_connections_start_after_the_triggering_call_had_its_turn() -> None:
    """Issue 28: ten tunnels opening in the same event-loop turn as a new agent's first call delayed its answer."""
    factory = Factory()
    pool = ConnectionPool(factory, scale_up_delay_s=3600.0)
    pool.start()
    await asyncio.sleep(0)
    factory.made[0].listener.on_active()
    assert pool.stats == PoolStats(idle=11, active=1, total=12)  # counted at once, as upstream's rule says
    for _ in range(10):
        await asyncio.sleep(0)
    assert [c.ran for c in factory.made] == [True, True] + [False] * 10
    await pool.stop()
    assert not any(c.ran for c in factory.made[2:])


async def test_scale_up_connections_do_start() -> None:
    factory = Factory()
    pool = ConnectionPool(factory, scale_up_delay_s=0.001)
    pool.start()
    factory.made[0].listener.on_active()
    await asyncio.gather(*(c.running.wait() for c in factory.made))  # bounded by the test's timeout
    assert pool.stats == PoolStats(idle=11, active=1, total=12)
    await pool.stop()


async def test_a_scale_up_stopped_before_its_start_never_runs_and_is_forgotten() -> None:
    factory = Factory()
    pool = ConnectionPool(factory, limits=PoolLimits(max_idle_time_s=0.0), scale_up_delay_s=0.001)
    pool.start()
    factory.made[0].listener.on_active()
    factory.made[0].listener.on_idle()
    assert pool.sweep_idle() == 10  # the extras, idle "too long" with a zero idle time, before their start
    await asyncio.sleep(0.01)
    stopped = [c for c in factory.made[2:] if c.stopped]
    assert len(stopped) >= 9 and not any(c.ran for c in stopped)
    assert pool.stats == PoolStats(idle=2, active=0, total=2)
    await pool.stop()
    assert not pool._slots  # no bookkeeping left for connections that never ran


async def test_stop_without_busy_connections_does_not_abort() -> None:
    factory = Factory()
    pool = ConnectionPool(factory)
    pool.start()
    await pool.stop()
    assert all(c.stopped and not c.aborted for c in factory.made)
    # No scale-up while closing.
    factory.made[0].listener.on_active()
    assert len(factory.made) == 2


async def test_a_crashed_loop_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_pool, "RESTART_DELAY_S", 0.0)
    factory = Factory()
    factory.fail = True
    pool = ConnectionPool(factory)
    pool.start()
    factory.fail = False
    for _ in range(100):
        await asyncio.sleep(0)
        if len(factory.made) >= 4:
            break
    assert len(factory.made) == 4
    assert pool.stats == PoolStats(idle=2, active=0, total=2)
    await pool.stop()


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="invalid pool limits"):
        PoolLimits(min_idle=0)
    with pytest.raises(ValueError, match="invalid pool limits"):
        PoolLimits(min_idle=3, max_connections=2)


async def test_sweep_stops_extra_idle_connections_without_waiting_for_their_attempt_to_end() -> None:
    factory, clock = Factory(), Clock()
    pool = ConnectionPool(factory, clock=clock)
    pool.start()
    factory.made[0].listener.on_active()  # scale-up: 2 + 10 connections
    assert pool.stats == PoolStats(idle=11, active=1, total=12)
    clock.now += 30
    assert pool.sweep_idle() == 0, "nothing is idle for a minute yet"
    clock.now += 31
    assert pool.sweep_idle() == 9
    assert pool.stats == PoolStats(idle=2, active=1, total=3)
    assert not factory.made[0].stopped, "the active connection is never swept"
    clock.now += 3600
    assert pool.sweep_idle() == 0, "never below the minimum"
    await pool.stop()
