"""agentk's tunnel connection manager: keeps a pool of idle reverse tunnels to kas (kas.md §1.4).

One tunnel carries one forwarded call (kas.md §1.1), so agentk keeps spare idle tunnels: at least
``min_idle``; when a request makes one active and fewer than ``min_idle`` stay idle, ``scale_up_step``
more are started, never more than ``max_connections`` in total (idle + active). An extra idle connection
is stopped when an attempt ends while it is idle, more than ``min_idle`` are idle and it has not been
active for ``max_idle_time_s`` (upstream ``connection_manager.go`` onIdle rule).

The state logic is independent of the network: connections come from a factory and only need
:class:`PooledConnection`'s three methods, so it is unit-tested with fake connections.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

__all__ = ["ConnectionFactory", "ConnectionPool", "PoolLimits", "PoolStats", "PooledConnection", "TunnelListener"]

_log = structlog.get_logger(__name__)

#: Seconds before replacing a connection whose loop ended on its own (never expected; see ``_on_exit``).
RESTART_DELAY_S = 1.0


class TunnelListener(Protocol):
    """What a connection reports to its manager (kas.md §1.4 onActive/onIdle)."""

    def on_active(self) -> None:
        """A request arrived on the connection's current tunnel (``request_info``)."""

    def on_idle(self) -> None:
        """One tunnel attempt ended (used or not); the connection is about to open the next one."""


class PooledConnection(Protocol):
    """A tunnel loop as the pool drives it (implemented by ``TunnelConnection``)."""

    async def run(self) -> None:
        """Open tunnels one after another until :meth:`stop`; return after the last attempt ended."""

    def stop(self) -> None:
        """Stop reconnecting; an idle tunnel closes now, an in-flight call may finish first."""

    def abort(self) -> None:
        """Stop now, cancelling an in-flight call too."""


#: Builds one connection that reports to the given listener.
ConnectionFactory = Callable[[TunnelListener], PooledConnection]


#: Seconds between a scale-up and the start of its connections (the triggering call's answer goes first).
SCALE_UP_DELAY_S = 0.005


@dataclass(frozen=True)
class PoolLimits:
    """Pool sizing, defaults from upstream ``agent/factory.go`` (kas.md §1.4).

    Attributes:
        min_idle: idle connections kept ready (2).
        scale_up_step: connections started at once when idle drops below ``min_idle`` (10).
        max_connections: cap on idle + active connections per agentk process (500).
        max_idle_time_s: seconds without activity after which an extra idle connection may stop (60).
    """

    min_idle: int = 2
    scale_up_step: int = 10
    max_connections: int = 500
    max_idle_time_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.min_idle <= self.max_connections or self.scale_up_step < 1:
            raise ValueError(f"invalid pool limits {self}")


@dataclass(frozen=True)
class PoolStats:
    """Connection counts for metrics: ``total`` is ``idle + active`` (stopped ones are not counted)."""

    idle: int
    active: int
    total: int


class _State(enum.Enum):
    IDLE = "idle"
    ACTIVE = "active"
    STOPPED = "stopped"


class _Slot:
    """One connection's bookkeeping; it is the listener the connection reports to."""

    def __init__(self, pool: ConnectionPool, number: int, now: float) -> None:
        self.pool = pool
        self.number = number
        self.state = _State.IDLE
        # A new connection counts as just active, so a fresh extra gets the full idle time.
        self.last_active = now
        self.connection: PooledConnection | None = None
        self.task: asyncio.Task[None] | None = None

    def on_active(self) -> None:
        self.pool._on_active(self)

    def on_idle(self) -> None:
        self.pool._on_idle(self)


class ConnectionPool:
    """Starts, scales and stops tunnel connections (kas.md §1.4 "Connection manager").

    Args:
        factory: builds a connection reporting to the listener it is given.
        limits: sizing rules.
        clock: monotonic seconds, injectable for tests.
        scale_up_delay_s: seconds between a scale-up and the start of its connections (counted at once).

    Use inside a running event loop: :meth:`start`, then :meth:`stop` once.
    """

    def __init__(
        self,
        factory: ConnectionFactory,
        *,
        limits: PoolLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        scale_up_delay_s: float = SCALE_UP_DELAY_S,
    ) -> None:
        self._factory = factory
        self._scale_up_delay_s = scale_up_delay_s
        self._limits = limits or PoolLimits()
        self._clock = clock
        self._slots: dict[int, _Slot] = {}
        self._numbers = itertools.count(1)
        self._idle = 0
        self._active = 0
        self._started = False
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def limits(self) -> PoolLimits:
        """The sizing rules in force."""
        return self._limits

    @property
    def stats(self) -> PoolStats:
        """Current idle/active/total counts."""
        return PoolStats(idle=self._idle, active=self._active, total=self._idle + self._active)

    def start(self) -> None:
        """Start ``min_idle`` connections.

        Raises:
            RuntimeError: called twice, or outside a running event loop.
        """
        if self._started:
            raise RuntimeError("connection pool already started")
        self._started = True
        self._start_connections(self._limits.min_idle)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop(), name="tunnel-idle-sweep")

    async def _sweep_loop(self) -> None:
        # The issue asks for extra idle tunnels to close after max_idle_time_s; upstream only checks when an
        # attempt ends, which can be much later. kas hands out its newest idle tunnel first, so the old
        # ones stopped here are rarely the one it is just starting to use.
        period = max(self._limits.max_idle_time_s / 6, 0.05)
        while not self._closing:
            await asyncio.sleep(period)
            try:
                self.sweep_idle()
            except Exception:  # the loop must outlive a bug in one round (issue 9: no loop dies silently)
                _log.exception("tunnel_idle_sweep_failed")

    def sweep_idle(self) -> int:
        """Stop idle connections above ``min_idle`` that have been idle over ``max_idle_time_s``; return how many."""
        now = self._clock()
        stopped = 0
        idle = sorted((s for s in self._slots.values() if s.state is _State.IDLE), key=lambda s: s.last_active)
        for slot in idle:
            if self._idle <= self._limits.min_idle or now - slot.last_active <= self._limits.max_idle_time_s:
                break
            self._stop_slot(slot)
            stopped += 1
        return stopped

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop every connection: idle tunnels close at once, in-flight calls get ``grace_s`` seconds.

        Connections still busy after the grace period are aborted. Returns when every loop has ended.
        """
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for slot in list(self._slots.values()):
            self._stop_slot(slot)
        tasks = [slot.task for slot in self._slots.values() if slot.task is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        if pending:
            _log.warning("tunnel_shutdown_grace_expired", in_flight=len(pending), grace_s=grace_s)
            for slot in list(self._slots.values()):
                if slot.connection is not None and slot.task in pending:
                    slot.connection.abort()
            await asyncio.wait(pending)

    def _start_connections(self, count: int, delay_s: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(count):
            slot = _Slot(self, next(self._numbers), self._clock())
            self._slots[slot.number] = slot
            self._idle += 1
            slot.connection = self._factory(slot)
            if delay_s > 0:
                loop.call_later(delay_s, self._run_slot, slot)
            else:
                self._run_slot(slot)
        if count:
            _log.debug("tunnels_started", count=count, idle=self._idle, active=self._active)

    def _run_slot(self, slot: _Slot) -> None:
        if slot.state is _State.STOPPED or self._closing or slot.connection is None:
            self._slots.pop(slot.number, None)  # stopped before its start came round: nothing runs
            return
        slot.task = asyncio.create_task(slot.connection.run(), name=f"tunnel-{slot.number}")
        slot.task.add_done_callback(functools.partial(self._on_exit, slot))

    def _on_active(self, slot: _Slot) -> None:
        if slot.state is not _State.IDLE:
            return
        slot.state = _State.ACTIVE
        self._idle -= 1
        self._active += 1
        self._scale_up()

    def _on_idle(self, slot: _Slot) -> None:
        now = self._clock()
        if slot.state is _State.ACTIVE:
            slot.state = _State.IDLE
            slot.last_active = now
            self._active -= 1
            self._idle += 1
        elif (
            slot.state is _State.IDLE
            and self._idle > self._limits.min_idle
            and now - slot.last_active > self._limits.max_idle_time_s
        ):
            self._stop_slot(slot)

    def _stop_slot(self, slot: _Slot) -> None:
        if slot.state is _State.STOPPED:
            return
        self._forget(slot)
        if slot.connection is not None:
            slot.connection.stop()

    def _forget(self, slot: _Slot) -> None:
        # Counters drop as soon as a connection is stopped, even though its loop may still be winding down.
        if slot.state is _State.IDLE:
            self._idle -= 1
        elif slot.state is _State.ACTIVE:
            self._active -= 1
        slot.state = _State.STOPPED

    def _on_exit(self, slot: _Slot, task: asyncio.Task[None]) -> None:
        self._slots.pop(slot.number, None)
        if slot.state is _State.STOPPED:
            return
        self._forget(slot)
        if task.cancelled():
            # Only the pool's owner cancels loops directly (tear-down): nothing to replace.
            _log.debug("tunnel_loop_cancelled", connection=slot.number)
            return
        # The loop ended without being stopped: a bug or an unexpected error. Refill the idle minimum a
        # little later, so that a loop failing at once cannot make the pool spin.
        _log.error("tunnel_loop_exited", connection=slot.number, error=repr(task.exception()))
        if not self._closing:
            asyncio.get_running_loop().call_later(RESTART_DELAY_S, self._replenish)

    def _replenish(self) -> None:
        if self._closing:
            return
        room = self._limits.max_connections - (self._idle + self._active)
        self._start_connections(max(0, min(self._limits.min_idle - self._idle, room)))

    def _scale_up(self) -> None:
        if self._closing or self._idle >= self._limits.min_idle:
            return
        room = self._limits.max_connections - (self._idle + self._active)
        # The call that made a tunnel active is answered first: ten tunnels opening at once in this event loop
        # delayed a new agent's first answer by about 1 ms (issue 28, wake-up). They count as idle already.
        self._start_connections(max(0, min(self._limits.scale_up_step, room)), self._scale_up_delay_s)
