"""The circuit breaker's rules (issue 27 item 5), on stand-in operations: pure logic, no store.

Real Redis frozen with SIGSTOP: ``tests/integration/test_rate_limit_redis.py`` and ``tests/e2e/test_redis_freeze.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.polling import poll
from tether.tool.circuit_breaker import CircuitBreaker, CircuitOpen

STALL_S = 0.05


class Store:
    """Answers when told to; PING answers when ``up``."""

    def __init__(self) -> None:
        self.up = True
        self.pings = 0

    async def ping(self) -> None:
        self.pings += 1
        if not self.up:
            await asyncio.Event().wait()  # frozen: never answers


async def answer_after(delay_s: float, value: int) -> int:
    await asyncio.sleep(delay_s)
    return value


async def never() -> int:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_call_waits_while_the_store_keeps_answering_others() -> None:
    stall_s = 0.5  # generous: a loaded machine must not make the answers below look like silence
    breaker = CircuitBreaker("test", Store().ping, stall_s=stall_s, first_answer_s=stall_s)
    # One answer every 0.05 s: the slow call (twice the stall bound) is queued behind them, not stalled.
    slow = asyncio.ensure_future(breaker.call(lambda: answer_after(2 * stall_s, 99)))
    for i in range(25):
        assert await breaker.call(lambda i=i: answer_after(0.05, i)) == i
    assert await slow == 99
    assert not breaker.is_open


async def test_a_silent_store_opens_the_circuit_and_calls_fail_at_once() -> None:
    store = Store()
    breaker = CircuitBreaker("test", store.ping, stall_s=STALL_S, first_answer_s=STALL_S, probe_every_s=STALL_S)
    assert await breaker.call(lambda: answer_after(0, 1)) == 1
    store.up = False
    waiting = [asyncio.ensure_future(breaker.call(never)) for _ in range(5)]
    for call in waiting:
        with pytest.raises(CircuitOpen):
            await call
    assert breaker.is_open
    with pytest.raises(CircuitOpen):
        await breaker.call(lambda: answer_after(0, 2))  # not even tried
    await asyncio.sleep(10 * STALL_S)
    assert breaker.is_open and store.pings >= 2, "probes go on while the store is silent"
    store.up = True

    async def closed() -> bool:
        return not breaker.is_open

    await poll(closed, "the probe to close the circuit")
    assert await breaker.call(lambda: answer_after(0, 3)) == 3
    await breaker.close()


async def test_an_error_opens_the_circuit_and_is_raised() -> None:
    breaker = CircuitBreaker("test", Store().ping, stall_s=STALL_S, probe_every_s=60)

    async def refused() -> int:
        raise ConnectionRefusedError("no Redis")

    with pytest.raises(ConnectionRefusedError):
        await breaker.call(refused)
    assert breaker.is_open
    await breaker.close()


async def test_the_first_answer_may_take_longer_while_connections_open() -> None:
    breaker = CircuitBreaker("test", Store().ping, stall_s=STALL_S, first_answer_s=20 * STALL_S)
    assert await breaker.call(lambda: answer_after(4 * STALL_S, 7)) == 7  # no answer yet: the longer bound
    with pytest.raises(CircuitOpen):
        await breaker.call(never)  # answered once: the stall bound
    await breaker.close()


async def test_priming_gives_the_first_call_the_stall_bound() -> None:
    store = Store()
    # Unprimed, the call below would wait for a first answer for a minute (past the test's timeout).
    breaker = CircuitBreaker("test", store.ping, stall_s=STALL_S, first_answer_s=60.0)
    await breaker.prime()
    assert store.pings == 1 and not breaker.is_open
    with pytest.raises(CircuitOpen):
        await breaker.call(never)
    await breaker.close()


async def test_priming_a_silent_store_opens_the_circuit() -> None:
    store = Store()
    store.up = False
    breaker = CircuitBreaker("test", store.ping, stall_s=STALL_S, first_answer_s=STALL_S, probe_every_s=STALL_S)
    await breaker.prime()  # returns: a failed priming is logged, not raised
    assert breaker.is_open
    await breaker.close()
