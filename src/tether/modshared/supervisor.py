"""The one place that starts, supervises and stops a process' modules and background loops (issue 24 item 3).

Restart policy: every background loop of kas and agentk (their own and the modules') runs under
:func:`tether.tool.supervisor.supervise`: a loop that crashes or returns is logged with its name and
restarted after a backoff (1 s growing to 30 s), and each restart counts in the Prometheus counter
``tether_<process>_background_loop_restarts_total{loop="<name>"}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from tether.modshared.module import Module
from tether.tool.backoff import Backoff
from tether.tool.supervisor import Loop, supervise

log = logging.getLogger(__name__)


class ModuleSupervisor:
    """Starts modules in order, stops them in reverse, and owns every background loop of the process.

    Args:
        process: ``"kas"`` or ``"agentk"``, for log lines and the metric's name.
        metrics: the registry the restart counter is registered in (the process' ``/metrics``); None: a
            registry of its own (tests).
        restart_delays: (first, largest) restart delay in seconds without jitter; default
            :func:`tether.tool.supervisor.restart_backoff` (tests shorten it).
    """

    def __init__(
        self,
        process: str,
        metrics: CollectorRegistry | None = None,
        *,
        restart_delays: tuple[float, float] | None = None,
    ) -> None:
        self._process = process
        self._started: list[Module] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._restart_delays = restart_delays
        self.restarts = Counter(
            f"tether_{process}_background_loop_restarts",
            "Background loops restarted after they crashed or returned, by loop name.",
            ["loop"],
            registry=metrics if metrics is not None else CollectorRegistry(),
        )

    @property
    def modules(self) -> list[Module]:
        """The modules started so far, in start order."""
        return list(self._started)

    def spawn(self, name: str, loop: Loop) -> asyncio.Task[Any]:
        """Run ``loop()`` as a supervised background loop named ``name`` until :meth:`cancel_loops`.

        A crash or return is logged and ``loop()`` called again after the backoff (module docstring).
        """
        backoff = None
        if self._restart_delays is not None:
            backoff = Backoff(initial_s=self._restart_delays[0], max_s=self._restart_delays[1], jitter=0.0)
        counter = self.restarts.labels(name)
        task = asyncio.get_running_loop().create_task(
            supervise(name, loop, backoff=backoff, on_restart=counter.inc), name=name
        )
        self._tasks.append(task)
        return task

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
