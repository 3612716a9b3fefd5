"""A circuit breaker for calls to a shared store that may stall (Redis) on a request's path (issue 27 item 5).

A frozen Redis (SIGSTOP, a stalled network path) accepts connections and never answers. Without a bound every
call waits for the client's socket timeout (3 s, kas.md §3.1) and every request waits with it: with Redis
stopped for 30 s a kas served 103 requests instead of about 2,460. A plain deadline per call would also give
up on a healthy Redis that is merely busy (a burst of 600 checks queued on the connection pool takes longer
than any deadline short enough for a request), so the breaker judges the store by its progress instead:

- a call gives up :data:`STALL_S` after the later of its own start and the last answer the store gave to any
  call: while answers keep coming, queued calls wait; when none has come for that long, the store is stalled.
  Until the store has answered once, the bound is :data:`FIRST_ANSWER_S`: the first burst opens every pooled
  connection, and on a loaded machine 600 checks at once saw their first answer after 0.7 s;
- giving up (or any error) opens the circuit: calls fail at once with :class:`CircuitOpen` without touching the
  store, and the caller falls back (local counters, no cache);
- while open, one probe at a time (a PING in the background, never on a request's path) runs every
  ``probe_every_s``; its answer closes the circuit.

A process primes its breakers at start (:meth:`CircuitBreaker.prime`: one probe through the breaker), so the short
bound applies from its first call. Unprimed, a kas whose Redis froze before its first rate-limit check waited
:data:`FIRST_ANSWER_S` in that check: requests overran their deadline, and an agent connecting then became
reachable after 9.4 s instead of 1.1 s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import Counter

from tether.tool.tasks import abandon

__all__ = ["STALL_S", "CircuitBreaker", "CircuitOpen"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds without any answer from the store after which a waiting call gives up and the circuit opens. Redis
#: answers in well under a millisecond; a quarter second of silence while calls wait means it does not answer.
STALL_S = 0.25
#: Seconds a call may wait for the store's very first answer (connections are being opened; kas.md §3.1 dial
#: timeout).
FIRST_ANSWER_S = 5.0
#: Seconds between probes while the circuit is open.
PROBE_EVERY_S = 1.0

_OPENED = Counter("tether_circuit_breaker_opened_total", "Times a store was found stalled or failing", ["store"])


class CircuitOpen(Exception):
    """The store is stalled or failing: the call was not made."""


class CircuitBreaker:
    """Guards the calls to one store.

    Args:
        store: its name in logs and in ``tether_circuit_breaker_opened_total{store}``, e.g. ``rate_limit``.
        probe: a cheap call that succeeds when the store answers (``PING``).
        stall_s: see :data:`STALL_S`.
        first_answer_s: see :data:`FIRST_ANSWER_S`.
        probe_every_s: seconds between probes while open.
        clock: monotonic clock in seconds.
    """

    def __init__(
        self,
        store: str,
        probe: Callable[[], Awaitable[object]],
        stall_s: float = STALL_S,
        first_answer_s: float = FIRST_ANSWER_S,
        probe_every_s: float = PROBE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._probe = probe
        self._stall_s = stall_s
        self._first_answer_s = first_answer_s
        self._probe_every_s = probe_every_s
        self._clock = clock
        self._last_answer: float | None = None
        self._open = False
        self._prober: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        """Whether calls currently fail at once."""
        return self._open

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation()`` unless the circuit is open; give up when the store stalls.

        Returns:
            the operation's result.

        Raises:
            CircuitOpen: the circuit is open (nothing was called), or the store stalled during this call
                (it was cancelled).
            Exception: the operation's own error (the circuit opens).
        """
        if self._open:
            raise CircuitOpen(f"{self._store}: the store is stalled or failing")
        started = self._clock()
        task = asyncio.ensure_future(operation())
        try:
            while True:
                remaining = self._give_up_at(started) - self._clock()
                if remaining > 0 and not self._open:
                    await asyncio.wait({task}, timeout=remaining)
                if task.done():
                    break
                if self._open or self._give_up_at(started) <= self._clock():
                    self._trip(f"no answer for {self._clock() - started:.2f} s")
                    raise CircuitOpen(f"{self._store}: the store did not answer")
        finally:
            if not task.done():
                abandon(task)  # never waited for: the store's client may take its socket timeout to end it
        if task.cancelled():  # cancelled from inside (the client's own cleanup), not by our caller
            self._trip("the call was cancelled")
            raise CircuitOpen(f"{self._store}: the call was cancelled")
        try:
            result = task.result()
        except Exception as exc:
            self._trip(repr(exc))
            raise
        self._last_answer = self._clock()
        return result

    async def prime(self) -> None:
        """Ask the store once through the breaker (the probe), at start.

        Later calls then wait :data:`STALL_S` for a silent store, not :data:`FIRST_ANSWER_S`. A failure opens the
        circuit, as any call's would.
        """
        try:
            await self.call(self._probe)
        except Exception as exc:  # CircuitOpen, or the error that opened it (logged by _trip)
            log.debug("%s: priming failed: %r", self._store, exc)

    def _give_up_at(self, started: float) -> float:
        if self._last_answer is None:
            return started + self._first_answer_s
        return max(started, self._last_answer) + self._stall_s

    def _trip(self, why: str) -> None:
        if self._open:
            return
        self._open = True
        _OPENED.labels(store=self._store).inc()
        log.warning("%s: Redis stalled or failing (%s); going on without it until it answers", self._store, why)
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_answered())

    async def _probe_until_answered(self) -> None:
        while True:
            await asyncio.sleep(self._probe_every_s)
            try:
                async with asyncio.timeout(self._stall_s * 4):
                    await self._probe()
            except Exception as exc:
                log.debug("%s: probe failed: %r", self._store, exc)
                continue
            self._last_answer = self._clock()
            self._open = False
            log.info("%s: Redis answers again", self._store)
            return

    async def close(self) -> None:
        """Stop probing (the owner closes its store)."""
        if self._prober is not None and not self._prober.done():
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
