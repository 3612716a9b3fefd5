"""Ending helper tasks: every task a call or session starts ends with it (issue 27 item 8).

A task that nobody awaits and nobody cancels can be collected while it still waits (asyncio then logs
``Task was destroyed but it is pending!`` at level error): the Graph API's relay left its queue reader that way
whenever a session ended while the reader waited. :func:`cancel_and_wait` is the one way a session or a routed
call ends the tasks it started.

The exception is work in a client that does not always end promptly when cancelled. redis-py, cancelled while a
new connection to a frozen Redis sent its handshake, went on until its 3 s socket timeout (and its retries): a
routed request overran its deadline waiting for such a read to end, and a kas took 38 s to stop with a 10 s
grace. :func:`wait_or_abandon` bounds such work without waiting for it to end; :func:`abandon` cancels it and
keeps it referenced until it has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["abandon", "cancel_and_wait", "wait_or_abandon"]

T = TypeVar("T")
#: Cancelled tasks nobody waits for, until they end (the loop itself keeps only weak references to tasks).
_ABANDONED: set[asyncio.Future[Any]] = set()


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None, drop_errors: bool = True) -> None:
    """Cancel the tasks that still run and wait until every one has ended.

    None entries are skipped. The wait goes on when the calling task is cancelled meanwhile (the tasks are
    cancelled already, so it is short), so no task is left behind; that cancellation is raised afterwards.

    Args:
        tasks: the tasks (or futures) to end.
        drop_errors: retrieve an ended task's exception here, so asyncio does not log it as never retrieved
            (the caller has its outcome another way, or none is expected); False leaves unexpected failures to
            asyncio's report.

    Raises:
        asyncio.CancelledError: the calling task was cancelled while it waited.
    """
    running = {task for task in tasks if task is not None and not task.done()}
    for task in running:
        task.cancel()
    cancelled = False
    while running:
        try:
            _, running = await asyncio.wait(running)
        except asyncio.CancelledError:
            cancelled = True
    for ended in tasks if drop_errors else ():
        if ended is not None and not ended.cancelled():
            ended.exception()
    if cancelled:
        raise asyncio.CancelledError


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` without waiting for it; keep it referenced until it ends and retrieve its error then."""
    task.cancel()
    if not task.done():
        _ABANDONED.add(task)
        task.add_done_callback(_forget)


def _forget(task: asyncio.Future[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()


async def wait_or_abandon(work: Awaitable[T], timeout_s: float) -> T:
    """``work``'s result if it ends within ``timeout_s`` seconds; otherwise :func:`abandon` it and raise at once.

    Unlike ``asyncio.wait_for``, the caller never waits for the cancelled work to end (see the module docstring).
    The work is abandoned too when the caller is cancelled.

    Raises:
        TimeoutError: ``timeout_s`` passed first.
        Exception: ``work``'s own error.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.0))
    except asyncio.CancelledError:
        abandon(task)
        raise
    if not done:
        abandon(task)
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    return task.result()
