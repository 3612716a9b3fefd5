"""The lifecycle every module follows in kas and in agentk (upstream ``modshared``/``modserver``/``modagent``).

A process holds an ordered list of *factories*. Each factory has a ``name`` and builds its module from the
process' API object (``tether.modserver.api.ServerApi`` in kas, ``tether.modagent.api.AgentApi`` in agentk),
registering its gRPC services while it does so, before any listener starts (upstream's "before servers"
phase). The :class:`~tether.modshared.supervisor.ModuleSupervisor` then starts the modules in list order
and stops them in reverse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class Spawner(Protocol):
    """Starts a supervised background loop (``ModuleSupervisor.spawn``)."""

    def __call__(self, name: str, loop: Callable[[], Awaitable[object]], /) -> asyncio.Task[Any]:
        """Run ``loop()`` under the name ``name`` until the process stops, restarted when it crashes or returns."""


class ModuleStartError(RuntimeError):
    """A module cannot start for a reason its operator can fix (address in use, unreadable certificate).

    The process reports the message as one clear line, without a traceback.
    """


class Module(Protocol):
    """One running feature module.

    Upstream's ``Module.Run(ctx)`` blocks until its context ends; here that is split in two so that a
    start-up failure (a listener that cannot bind) aborts the process before it reports ready:
    :meth:`start` returns once the module serves, :meth:`stop` undoes it. Long-running loops are handed
    to the supervisor (``api.spawn``), which owns and watches them.
    """

    @property
    def name(self) -> str:
        """The module's name, as in its factory and in log lines."""

    async def start(self) -> None:
        """Start serving and return (listeners bound, loops spawned).

        Raises:
            Exception: any failure aborts the process' start-up; modules started before are stopped.
        """

    async def stop(self) -> None:
        """Stop serving, honouring the module's own grace periods; called once, in reverse start order."""


class IdleModule:
    """A module whose whole work is the services it registered while being built (nothing to start or stop).

    Args:
        name: the module's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The module's name."""
        return self._name

    async def start(self) -> None:
        """Nothing to start: the services run on the process' listeners."""

    async def stop(self) -> None:
        """Nothing to stop: the process stops its listeners."""
