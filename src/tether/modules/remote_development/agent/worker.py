"""The agentk module's loop: leader only, full and partial reconciliation on their timers (reference §5.1-§5.2).

The factory is ``leader_only``: agentk runs the module only on the replica that holds the Lease
``agent-<agent id>-lock`` (:mod:`tether.modagent.leader`), and the replicas compete once a configuration
with a ``remote_development`` section arrived (:meth:`RemoteDevelopmentAgent.is_runnable_configuration`).
The leader watches the workspaces and reconciles: a full sync at once, then a partial one every
``partial_sync_interval`` after the previous run ended, and a full one every ``full_sync_interval``; a new
leader and every configuration change start over with a full sync.
A configuration without the section changes nothing (GitLab skips the update when the section is absent;
issue 27 item 7). With ``enabled: false`` the leader keeps reconciling, unlike upstream's no-op worker: the
hub then stops every workspace (volumes kept), and only a reconciling agentk can scale them down; the cost
is one request per ``partial_sync_interval``.
Failed runs are logged and retried at the next tick (a failed full sync is retried as full).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
import structlog

from tether.kube.client import KubeClient
from tether.modagent.api import AgentApi
from tether.modshared.module import Module
from tether.modules.remote_development import MODULE_NAME
from tether.modules.remote_development.agent.informer import UNSCHEDULABLE_GRACE_S, WorkspaceInformer
from tether.modules.remote_development.agent.reconciler import Reconciler
from tether.modules.remote_development.protocol import (
    DEFAULT_FULL_SYNC_SECONDS,
    DEFAULT_PARTIAL_SYNC_SECONDS,
    ReconcileRequest,
    ReconcileResponse,
)
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2

_log = structlog.get_logger(__name__)
#: After a change in the cluster, the next partial run waits this long (changes coalesce; the hub sees at
#: most one request a second from an agent).
EARLY_RUN_DELAY_S = 1.0
#: How long the watch may take to list everything before the first run goes ahead anyway.
SYNC_WAIT_S = 30.0

#: Sends a module request to the hub: (path, JSON body) -> (status, body bytes); raises when unreachable.
HubRequest = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]


class ReconcileRefused(Exception):
    """The hub answered something other than 201, or a body that is not a reconcile response; the message says which."""


@dataclass(frozen=True)
class SyncSettings:
    """The module's part of the agent configuration.

    Attributes:
        enabled: workspaces on.
        partial_s, full_s: the intervals in seconds (defaults 10 s and 1 h; must be > 0).
        unschedulable_grace_s: how long a pod may stay unschedulable before that is a failure (not part of
            the configuration; tests shorten or lengthen it).
    """

    enabled: bool
    partial_s: float
    full_s: float
    unschedulable_grace_s: float = UNSCHEDULABLE_GRACE_S

    @classmethod
    def from_configuration(cls, configuration: agentcfg_pb2.AgentConfiguration) -> SyncSettings:
        """Defaults applied (upstream ``DefaultAndValidateConfiguration``); zero or negative means default."""
        section = configuration.remote_development
        partial = section.partial_sync_interval.ToTimedelta().total_seconds()
        full = section.full_sync_interval.ToTimedelta().total_seconds()
        return cls(
            enabled=section.enabled,
            partial_s=partial if partial > 0 else DEFAULT_PARTIAL_SYNC_SECONDS,
            full_s=full if full > 0 else DEFAULT_FULL_SYNC_SECONDS,
        )


class RemoteDevelopmentWorker:
    """The leader's loop for one configuration.

    Args:
        client: API client.
        request: sends module requests to the hub through kas.
        agent_id: the agent's id.
        settings: the intervals.
    """

    def __init__(self, client: KubeClient, request: HubRequest, agent_id: int, settings: SyncSettings) -> None:
        self._client = client
        self._request = request
        self._agent_id = agent_id
        self._settings = settings
        self.runs = 0
        self.last_error = ""

    async def _send(self, body: ReconcileRequest) -> ReconcileResponse:
        status, answer = await self._request("/reconcile", msgspec.json.encode(body))
        if status != 201:
            raise ReconcileRefused(f"the hub answered {status}: {answer[:500].decode(errors='replace')}")
        try:
            return msgspec.json.decode(answer, type=ReconcileResponse)
        except msgspec.ValidationError as exc:
            raise ReconcileRefused(f"the hub's answer is not a reconcile response: {exc}") from None

    async def run(self) -> None:
        """Reconcile until cancelled."""
        informer = WorkspaceInformer(self._client, self._agent_id)
        informer.start()
        grace_s = self._settings.unschedulable_grace_s
        try:
            if not await informer.wait_synced(SYNC_WAIT_S):
                _log.warning("workspaces_watch_not_synced", waited_s=SYNC_WAIT_S, error=informer.last_error)
            reconciler = Reconciler(self._client, informer, self._agent_id, grace_s)
            next_full = time.monotonic() + self._settings.full_s
            while True:
                if time.monotonic() >= next_full:
                    reconciler = Reconciler(
                        self._client, informer, self._agent_id, self._settings.unschedulable_grace_s
                    )
                    next_full = time.monotonic() + self._settings.full_s
                kind = "partial" if reconciler.full_done else "full"
                started = time.monotonic()
                informer.changed.clear()  # what changes from now on is for the next run
                try:
                    answered = await reconciler.run(self._send)
                    self.runs += 1
                    self.last_error = ""
                    # Full syncs are rare (hourly, restarts, leader changes): worth a line at info level.
                    (_log.info if kind == "full" else _log.debug)(
                        "workspaces_reconciled",
                        kind=kind,
                        workspaces=answered,
                        ms=round((time.monotonic() - started) * 1000),
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.last_error = str(exc)
                    _log.warning("workspaces_reconcile_failed", kind=kind, error=str(exc))
                await self._wait_for_next_run(informer)
        finally:
            await informer.stop()

    async def _wait_for_next_run(self, informer: WorkspaceInformer) -> None:
        # Tether: a change seen in the cluster is reported after EARLY_RUN_DELAY_S rather than at the next
        # tick, so Running or Failed reach the user in about a second; quiet clusters wait the whole interval.
        try:
            await asyncio.wait_for(informer.changed.wait(), max(self._settings.partial_s - EARLY_RUN_DELAY_S, 0))
        except TimeoutError:
            return
        await asyncio.sleep(EARLY_RUN_DELAY_S)


class RemoteDevelopmentAgent:
    """The ``remote_development`` agentk module: configuration in, a worker per configuration (leader only).

    Args:
        api: the agentk module API (Kubernetes client, hub requests through kas, pod identity).
    """

    def __init__(self, api: AgentApi) -> None:
        self._api = api
        self._agent_id = 0
        self._settings: SyncSettings | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[object] | None = None
        self.worker: RemoteDevelopmentWorker | None = None

    @property
    def name(self) -> str:
        """The module's name."""
        return MODULE_NAME

    async def _request(self, path: str, body: bytes) -> tuple[int, bytes]:
        response = await self._api.make_gitlab_request(MODULE_NAME, path, method="POST", body=body)
        return response.status, response.body

    def on_configuration(self, configuration: agentcfg_pb2.AgentConfiguration) -> None:
        """Take a new agent configuration; a change of the module's section restarts the worker (full sync).

        A configuration without the section keeps the previous settings (module docstring).
        """
        self._agent_id = configuration.agent_id
        if not configuration.HasField("remote_development"):
            return
        settings = SyncSettings.from_configuration(configuration)
        if settings != self._settings:
            self._settings = settings
            self._changed.set()

    def is_runnable_configuration(self, configuration: agentcfg_pb2.AgentConfiguration) -> bool:
        """True with a ``remote_development`` section: only then do the replicas compete (upstream's check)."""
        return configuration.HasField("remote_development")

    async def start(self) -> None:
        """Start the module's loop (agentk calls it on the leader; it waits for the module's section)."""
        self._task = self._api.spawn("remote_development", self.run)

    async def stop(self) -> None:
        """Stop the loop (leadership lost or agentk stopping)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        """Wait for the module's section, then run a worker per configuration until cancelled."""
        while self._settings is None or not self._agent_id:
            self._changed.clear()
            await self._changed.wait()
        while True:
            self._changed.clear()
            settings = self._settings
            assert settings is not None
            # enabled or not: with enabled false the hub answers with every workspace stopped (module docstring)
            self.worker = RemoteDevelopmentWorker(self._api.kube, self._request, self._agent_id, settings)
            task = asyncio.create_task(self.worker.run(), name="remote_development worker")
            _log.info(
                "workspaces_worker_started",
                enabled=settings.enabled,
                partial_s=settings.partial_s,
                full_s=settings.full_s,
            )
            try:
                await self._changed.wait()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


class RemoteDevelopmentAgentFactory:
    """Builds the ``remote_development`` agentk module (leader only, upstream ``IsProducingLeaderModules``).

    agentk wraps the module in :class:`tether.modagent.leader.LeaderOnlyModules` for this flag.
    """

    name = MODULE_NAME
    leader_only = True

    def new(self, api: AgentApi) -> Module:
        """The module, subscribed to configuration changes."""
        module = RemoteDevelopmentAgent(api)
        api.on_configuration(module.on_configuration)
        return module
