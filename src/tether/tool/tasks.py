"""Ending helper tasks: every task a call or session starts ends with it (issue 27 item 8).

A task that nobody awaits and nobody cancels can be collected while it still waits (asyncio then logs
``Task was destroyed but it is pending!`` at level error): the Graph API's relay left its queue reader that way
whenever a session ended while the reader waited. :func:`cancel_and_wait` is the one way a session or a routed
call ends the tasks it started.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


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
