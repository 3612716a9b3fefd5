"""The one place that starts, supervises and stops a process' modules and background loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from tether.modshared.module import Module

log = logging.getLogger(__name__)


class ModuleSupervisor:
    """Starts modules in order, stops them in reverse, and owns every background loop of the process.

    A background loop that ends with an exception is logged with its name at once (not when the process
    stops), so a dead loop is visible while the process keeps serving.

    Args:
        process: ``"kas"`` or ``"agentk"``, for log lines.
    """

    def __init__(self, process: str) -> None:
        self._process = process
        self._started: list[Module] = []
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def modules(self) -> list[Module]:
        """The modules started so far, in start order."""
        return list(self._started)

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a supervised background loop named ``name``; it is cancelled by :meth:`cancel_loops`."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._report)
        self._tasks.append(task)
        return task

    def _report(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s loop %s failed: %r", self._process, task.get_name(), exc, exc_info=exc)

    async def start(self, modules: Sequence[Module]) -> None:
        """Start ``modules`` one after the other.

        Raises:
            Exception: whatever a module's ``start`` raised, after the modules started before it were
                stopped in reverse order.
        """
        for module in modules:
            try:
                await module.start()
            except BaseException:
                await self.stop_modules()
                raise
            self._started.append(module)
            log.debug("%s module %s started", self._process, module.name)

    async def stop_modules(self) -> None:
        """Stop the started modules in reverse order; a failing ``stop`` is logged and the rest still stop."""
        while self._started:
            module = self._started.pop()
            try:
                await module.stop()
            except Exception:
                log.exception("%s module %s failed to stop cleanly", self._process, module.name)

    async def cancel_loops(self) -> None:
        """Cancel every background loop and wait for them to end."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
