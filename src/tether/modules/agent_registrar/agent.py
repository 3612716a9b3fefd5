"""agentk's registration loop: ``AgentRegistrar.Register`` now and every 5 minutes (kas.md §3.3).

Like upstream agentk, the pod id is random per process and the configuration stream is opened with
``skip_register = true``, so this loop alone makes the pod appear in kas' agent tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

import grpc
import structlog
from grpc import aio

from tether.kube.client import KubeError
from tether.modagent.agent_meta import build_agent_meta
from tether.modagent.api import AgentApi
from tether.modshared.module import Module
from tether.pb.gitlab.agent.agent_registrar.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.entity import entity_pb2
from tether.tool.backoff import Backoff
from tether.tool.grpc_meta import Metadata

__all__ = ["REGISTER_PERIOD_S", "AgentRegistrarAgentFactory", "Registrar", "register_backoff"]

_log = structlog.get_logger(__name__)

#: Seconds between successful registrations (upstream agentk's cadence).
REGISTER_PERIOD_S = 300.0
#: Seconds one Register call may take.
REGISTER_TIMEOUT_S = 20.0

#: Returns the ``AgentMeta`` to send; called before every registration (upstream refreshes the Kubernetes version).
MetaSource = Callable[[], Awaitable[entity_pb2.AgentMeta]]


def register_backoff() -> Backoff:
    """Backoff after a failed Register: 10 s to 5 min, factor 2, jitter 1, reset after 10 min (kas.md §3.3)."""
    return Backoff(initial_s=10.0, max_s=300.0, factor=2.0, jitter=1.0, reset_after_s=600.0)


class Registrar:
    """Registers this pod with kas until cancelled.

    Args:
        channel: channel to kas' agent listener.
        agent_meta: produces the ``AgentMeta`` of each call.
        metadata: per-RPC metadata (``authorization: Bearer <token>`` and ``--kas-header`` pairs).
        period_s: seconds between successful calls.
        backoff: delays after failures; defaults to :func:`register_backoff`.
        pod_id: this pod's id (agentk's connection id); 0 picks a random one.
    """

    def __init__(
        self,
        channel: aio.Channel,
        agent_meta: MetaSource,
        *,
        metadata: Metadata = (),
        period_s: float = REGISTER_PERIOD_S,
        backoff: Backoff | None = None,
        pod_id: int = 0,
    ) -> None:
        self._stub = rpc_pb2_grpc.AgentRegistrarStub(channel)
        self._agent_meta = agent_meta
        self._metadata = metadata
        self._period_s = period_s
        self._backoff = backoff or register_backoff()
        self.pod_id = pod_id or random.getrandbits(63) or 1
        self.registered = False
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Register again now, e.g. because the configuration stream moved to another kas.

        A kas that shuts down deletes the entries it wrote (Tether kas does), so the pod re-registers through
        the kas it reconnects to instead of waiting for the next period.
        """
        self._wake.set()

    async def run(self) -> None:
        """Register now, then every ``period_s`` (after failures: with backoff) or when poked; never returns."""
        while True:
            self._wake.clear()
            ok = await self.register_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._period_s if ok else self._backoff.next_delay())

    async def register_once(self) -> bool:
        """One ``Register`` call; True when kas accepted it. Failures are logged with their reason."""
        request = rpc_pb2.RegisterRequest(agent_meta=await self._agent_meta(), pod_id=self.pod_id)
        try:
            await self._stub.Register(request, metadata=self._metadata, timeout=REGISTER_TIMEOUT_S, wait_for_ready=True)
        except aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
                _log.warning("agent_register_timed_out", code=code.name, details=details)
            else:
                hint = "is kas older than this agentk?" if code is grpc.StatusCode.UNIMPLEMENTED else None
                _log.error("agent_register_failed", code=code.name, details=details, hint=hint)
            return False
        if not self.registered:
            _log.info("agent_registered", pod_id=self.pod_id)
        self.registered = True
        self._backoff.reset()
        return True


#: Seconds to wait for the cluster's /version before a registration (the version is optional).
KUBE_VERSION_TIMEOUT_S = 10.0


class _RegistrarModule:
    """Runs the registration loop as a supervised background loop."""

    name = "agent_registrar"

    def __init__(self, registrar: Registrar, api: AgentApi) -> None:
        self._registrar = registrar
        self._api = api

    async def start(self) -> None:
        """Spawn the loop (the supervisor cancels it at shutdown)."""
        self._api.spawn(self.name, self._registrar.run)

    async def stop(self) -> None:
        """Nothing to undo: the loop is cancelled with the other supervised loops."""


class AgentRegistrarAgentFactory:
    """agentk half of ``agent_registrar``: registers the pod with kas, like upstream agentk."""

    name = "agent_registrar"
    leader_only = False

    def new(self, api: AgentApi) -> Module | None:
        """Build the loop; None without a kas connection."""
        if api.kas is None:
            return None

        async def current_meta() -> entity_pb2.AgentMeta:
            # Upstream re-reads the cluster's version before every registration.
            try:
                version = await asyncio.wait_for(api.kube.server_version(), KUBE_VERSION_TIMEOUT_S)
            except (KubeError, TimeoutError) as exc:
                _log.warning("kubernetes_version_unavailable", error=str(exc))
                version = None
            return build_agent_meta(version)

        registrar = Registrar(api.kas, current_meta, metadata=api.kas_metadata, pod_id=api.connection_id)
        api.on_configuration_stream_end(registrar.poke)
        return _RegistrarModule(registrar, api)
