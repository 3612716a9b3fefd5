"""Leader-only modules (upstream ``IsProducingLeaderModules`` and agentk's leader runner; workspaces.md §5.1).

A factory whose ``leader_only`` is true builds a module that must run on one agentk replica at a time.
:func:`build_modules` puts every such module behind one :class:`LeaderOnlyModules` wrapper: the replicas
compete for the Lease ``agent-<agent id>-lock`` in the pod's namespace (identity the pod name; 15 s / 10 s /
2 s, :class:`~tether.kube.lease.LeaderElector`), and the wrapped modules are started, in list order, while
this replica leads and stopped, in reverse, when it loses the Lease or agentk stops (the Lease is then
released so another replica takes over at once).

The replica begins to compete once a configuration arrived that one of the wrapped modules can run
(:class:`RunnableCheck`, upstream ``IsRunnableConfiguration``; any configuration for modules without the
check): an agent without e.g. a ``remote_development`` section creates no Lease. It keeps competing after
that (a later configuration without the section changes nothing, issue 27 item 7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import structlog

from tether.kube.lease import LeaderElector, workload_owner
from tether.modagent.api import AgentApi, AgentModuleFactory
from tether.modshared.module import Module
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2

__all__ = ["LeaderOnlyModules", "RunnableCheck", "build_modules", "lease_name"]

_log = structlog.get_logger(__name__)


def lease_name(agent_id: int) -> str:
    """The Lease the replicas of agent ``agent_id`` compete for (upstream ``agent-<id>-lock``)."""
    return f"agent-{agent_id}-lock"


@runtime_checkable
class RunnableCheck(Protocol):
    """A leader-only module that runs only with some configurations (upstream ``IsRunnableConfiguration``)."""

    def is_runnable_configuration(self, configuration: agentcfg_pb2.AgentConfiguration) -> bool:
        """True when ``configuration`` gives the module something to do (then the replica competes)."""


class LeaderOnlyModules:
    """Runs ``modules`` only while this agentk replica holds the agent's Lease (module docstring).

    Args:
        api: the agentk module API (Kubernetes client, pod identity, configurations, ``spawn``).
        modules: the leader-only modules, in start order.
        lease_timings: (duration, renew deadline, retry period) in seconds; upstream's 15 / 10 / 2 by default.
    """

    name = "leader_only_modules"

    def __init__(
        self,
        api: AgentApi,
        modules: Sequence[Module],
        lease_timings: tuple[float, float, float] = (15.0, 10.0, 2.0),
    ) -> None:
        self._api = api
        self._modules = list(modules)
        self._timings = lease_timings
        self._agent_id = 0
        self._runnable = asyncio.Event()
        self._task: asyncio.Task[object] | None = None
        self.elector: LeaderElector | None = None
        self.running: list[Module] = []
        api.on_configuration(self._on_configuration)

    def _on_configuration(self, configuration: agentcfg_pb2.AgentConfiguration) -> None:
        self._agent_id = configuration.agent_id
        if any(
            not isinstance(module, RunnableCheck) or module.is_runnable_configuration(configuration)
            for module in self._modules
        ):
            self._runnable.set()

    async def start(self) -> None:
        """Start competing in the background (the modules start when this replica leads)."""
        self._task = self._api.spawn(self.name, self._compete)

    async def stop(self) -> None:
        """Stop competing: running modules stop in reverse order and the Lease is released."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _compete(self) -> None:
        await self._runnable.wait()
        api = self._api
        owner = await workload_owner(api.kube, api.pod_namespace, api.pod_name)  # the Lease goes with the workload
        duration, deadline, retry = self._timings
        self.elector = LeaderElector(
            api.kube,
            api.pod_namespace,
            lease_name(self._agent_id),
            api.pod_name,
            lease_duration_s=duration,
            renew_deadline_s=deadline,
            retry_period_s=retry,
            owner=owner,
        )
        await self.elector.run(self._lead)

    async def _lead(self) -> None:
        try:
            for module in self._modules:
                await module.start()
                self.running.append(module)
                _log.info("leader_module_started", module=module.name)
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(self._stop_running())

    async def _stop_running(self) -> None:
        while self.running:
            module = self.running.pop()
            try:
                await module.stop()
            except Exception as exc:
                _log.error("leader_module_stop_failed", module=module.name, error=repr(exc))
            else:
                _log.info("leader_module_stopped", module=module.name)


def build_modules(factories: Sequence[AgentModuleFactory], api: AgentApi) -> list[Module]:
    """Build agentk's modules in list order; the ``leader_only`` ones go behind one :class:`LeaderOnlyModules`.

    The wrapper takes the place of the first leader-only module in the start order. Factories returning
    None (not configured) are left out.
    """
    modules: list[Module] = []
    leader_only: list[Module] = []
    place = 0
    for factory in factories:
        module = factory.new(api)
        if module is None:
            continue
        if factory.leader_only:
            place = place if leader_only else len(modules)
            leader_only.append(module)
        else:
            modules.append(module)
    if leader_only:
        modules.insert(place, LeaderOnlyModules(api, leader_only))
    return modules
