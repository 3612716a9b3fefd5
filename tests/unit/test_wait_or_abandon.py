"""``wait_or_abandon``: bounded waits on work that does not end promptly when cancelled (tool/tasks.py).

The stubborn work stands in for redis-py's command on a new connection to a frozen Redis, which went on after
being cancelled until its socket timeout. Order is observed through events, never through elapsed time.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from tether.tool import tasks
from tether.tool.tasks import wait_or_abandon


def abandoned(work: object) -> set[asyncio.Future[object]]:
    """The abandoned tasks running ``work`` (other tests on the same loop may have abandoned tasks of their own)."""
    return {task for task in tasks._ABANDONED if isinstance(task, asyncio.Task) and task.get_coro() is work}


class Stubborn:
    """Work that takes one cancellation without ending, then ends when ``release`` is set."""

    def __init__(self, error: Exception | None = None) -> None:
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.ended = False
        self.error = error

    async def run(self) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
        await self.release.wait()
        self.ended = True
        if self.error is not None:
            raise self.error
        return "late"


async def test_the_result_of_work_that_ends_in_time() -> None:
    async def quick() -> int:
        return 7

    assert await wait_or_abandon(quick(), 5.0) == 7


async def test_the_error_of_work_that_fails_in_time() -> None:
    async def failing() -> None:
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError, match="refused"):
        await wait_or_abandon(failing(), 5.0)


async def test_a_timeout_returns_without_waiting_for_the_cancelled_work() -> None:
    work = Stubborn()
    running = work.run()
    with pytest.raises(TimeoutError):
        await wait_or_abandon(running, 0.05)
    await work.cancelled.wait()
    assert not work.ended  # the caller went on while the work still ran
    gc.collect()
    kept = abandoned(running)
    assert len(kept) == 1  # kept alive although nobody awaits it
    work.release.set()
    await asyncio.gather(*kept, return_exceptions=True)
    assert work.ended


async def test_a_cancelled_caller_abandons_the_work_too() -> None:
    work = Stubborn(ConnectionError("late failure"))
    running = work.run()
    caller = asyncio.ensure_future(wait_or_abandon(running, 60.0))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await work.cancelled.wait()
    assert not work.ended
    loop = asyncio.get_running_loop()
    reports: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        kept = abandoned(running)
        assert len(kept) == 1
        work.release.set()
        await asyncio.wait(kept)
        await asyncio.sleep(0)  # the done callback that forgets the task runs one step later
        assert not abandoned(running)
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert work.ended
    # Its error was retrieved: asyncio had no "exception was never retrieved" to report when it was collected.
    assert reports == []
