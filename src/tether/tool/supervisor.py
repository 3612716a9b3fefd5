"""Supervised background loops: none dies silently (issue 9 item 6).

A process' background loops (refresh, GC, pub/sub, counters) are meant to run until the process stops. When
one crashes, :func:`supervise` logs the failure with its traceback and restarts it after a backoff; a loop
that returns on its own is restarted too, since that is a bug of the same kind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tether.tool.backoff import Backoff

__all__ = ["supervise"]

_log = logging.getLogger(__name__)


async def supervise(
    name: str,
    loop: Callable[[], Awaitable[object]],
    *,
    backoff: Backoff | None = None,
    restarts: list[int] | None = None,
) -> None:
    """Run ``loop()`` until cancelled, restarting it whenever it fails or returns.

    Args:
        name: the loop's name in log lines (``background_loop`` field).
        loop: starts one run of the loop.
        backoff: delays between restarts; defaults to 1 s growing to 30 s, reset after 60 s without a crash.
        restarts: when given, one element is appended per restart (for tests and metrics).
    """
    delays = backoff or Backoff(initial_s=1.0, max_s=30.0, jitter=0.2, reset_after_s=60.0)
    while True:
        try:
            await loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            delay = delays.next_delay()
            _log.exception(
                "background loop %s crashed; restarting in %.1f s", name, delay, extra={"background_loop": name}
            )
        else:
            delay = delays.next_delay()
            _log.error(
                "background loop %s returned; restarting in %.1f s", name, delay, extra={"background_loop": name}
            )
        if restarts is not None:
            restarts.append(1)
        await asyncio.sleep(delay)
