"""Supervised background loops: none dies silently (issue 9 item 6; one restart policy, issue 24 item 3).

A process' background loops (refresh, GC, pub/sub, counters, module loops) are meant to run until the process
stops. When one crashes, :func:`supervise` logs the failure with its traceback and restarts it after a backoff;
a loop that returns on its own is restarted too, since that is a bug of the same kind. Every loop of kas and
agentk runs under this one policy through :meth:`tether.modshared.supervisor.ModuleSupervisor.spawn`, which
also counts the restarts in a Prometheus counter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tether.tool.backoff import Backoff

__all__ = ["Loop", "restart_backoff", "supervise"]

_log = logging.getLogger(__name__)

#: Starts one run of a background loop (a coroutine function: a coroutine cannot be restarted, a factory can).
Loop = Callable[[], Awaitable[object]]


def restart_backoff() -> Backoff:
    """The restart delays: 1 s growing to 30 s with 20 % jitter, back to 1 s after 60 s without a crash."""
    return Backoff(initial_s=1.0, max_s=30.0, jitter=0.2, reset_after_s=60.0)


async def supervise(
    name: str,
    loop: Loop,
    *,
    backoff: Backoff | None = None,
    on_restart: Callable[[], None] | None = None,
) -> None:
    """Run ``loop()`` until cancelled, restarting it whenever it fails or returns.

    Args:
        name: the loop's name in log lines (``background_loop`` field).
        loop: starts one run of the loop.
        backoff: delays between restarts; defaults to :func:`restart_backoff`.
        on_restart: called once per restart, before the delay (the supervisor's metric).
    """
    delays = backoff or restart_backoff()
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
        if on_restart is not None:
            on_restart()
        await asyncio.sleep(delay)
