"""The agentk process: the internal server, the modules of ``AGENT_MODULES``, the kas connection, observability.

Start order follows upstream (kas.md §6.4): internal gRPC server with the module APIs -> reverse tunnel
pool ("after servers": the descriptor lists every registered API) -> configuration watcher. Shutdown runs
in reverse; in-flight tunnelled calls get a grace period (kas.md §8.6).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import signal
from collections.abc import Sequence

import grpc
import structlog
from aiohttp import web
from grpc import aio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from tether import __version__
from tether.agentk.config import AgentkConfig
from tether.agentk.modules import AGENT_MODULES
from tether.kube.client import KubeClient, KubeError, ServerVersion
from tether.kube.kubeconfig import load_credentials
from tether.modagent.agent_meta import build_agent_meta
from tether.modagent.api import AgentApi, AgentModuleFactory
from tether.modagent.internal_server import InternalServer
from tether.modagent.leader import build_modules
from tether.modshared.module import Module
from tether.modshared.supervisor import ModuleSupervisor
from tether.modules.agent_configuration.agent import ConfigurationWatcher
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2
from tether.tool.http_server import SafeAppRunner
from tether.tool.logs import CONNECTION_ID_METADATA, set_process_fields, setup_logging
from tether.tool.memory import freeze_startup_heap
from tether.tunnel.agent.connection import ConnectedTunnels, TunnelConnection
from tether.tunnel.agent.pool import ConnectionPool, PooledConnection, TunnelListener

__all__ = ["AgentkApp", "configure_logging"]

_log = structlog.get_logger(__name__)

#: Seconds to wait for the cluster's /version at start-up (AgentMeta.kubernetes_version is optional).
KUBE_VERSION_TIMEOUT_S = 10.0


def configure_logging(level: str = "info") -> None:
    """Log one JSON object per line to stderr (the processes' one set-up, :mod:`tether.tool.logs`).

    Raises:
        ValueError: unknown ``level``.
    """
    setup_logging(level)


class AgentkApp:
    """One agentk process.

    Args:
        config: parsed flags and environment (``tether.agentk.config``).
        modules: module factories in start order (default: :data:`tether.agentk.modules.AGENT_MODULES`).
    """

    def __init__(self, config: AgentkConfig, modules: Sequence[AgentModuleFactory] | None = None) -> None:
        self._config = config
        self._factories = AGENT_MODULES if modules is None else modules
        self._api: AgentApi | None = None
        self._connected = ConnectedTunnels()
        self._watcher: ConfigurationWatcher | None = None
        self._pool: ConnectionPool | None = None
        self.registry = CollectorRegistry()
        self._register_metrics()
        self.supervisor = ModuleSupervisor("agentk", self.registry)

    def readiness(self) -> str | None:
        """None when ready (a configuration arrived and a tunnel is connected), else the reason why not."""
        if self._watcher is None or not self._watcher.has_configuration:
            return "no agent configuration received from kas yet"
        if self._connected.value < 1:
            return "no reverse tunnel connected to kas"
        return None

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set, or until SIGTERM/SIGINT when ``stop`` is None.

        Raises:
            tether.kube.kubeconfig.KubeConfigError: Kubernetes credentials cannot be loaded.
            OSError: the observability address cannot be bound.
        """
        if stop is None:
            stop = _stop_on_signals()
        config = self._config
        credentials = load_credentials(config.kubeconfig)
        kube = KubeClient(credentials)
        message_limits = [
            ("grpc.max_receive_message_length", config.max_receive_message_bytes),
            ("grpc.max_send_message_length", config.max_send_message_bytes),
        ]
        internal = InternalServer(options=message_limits)
        kas_channel = self._kas_channel()
        # This process' connection id: the pod id it registers with, on its log lines and sent to kas with
        # every call so kas' lines about this connection carry it too (issue 9 item 6).
        connection_id = random.getrandbits(63) or 1
        set_process_fields(connection_id=connection_id)
        metadata = (*config.call_metadata(), (CONNECTION_ID_METADATA, str(connection_id)))
        api = AgentApi(
            kube,
            credentials,
            internal,
            self.supervisor.spawn,
            kas=kas_channel,
            kas_metadata=metadata,
            connection_id=connection_id,
        )
        self._api = api
        modules = build_modules(self._factories, api)  # leader_only ones behind the leader wrapper
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(kas_channel.close)
            stack.push_async_callback(kube.close)
            await self._start(stack, api, modules)
            await stop.wait()
            _log.info("agentk_stopping", grace_s=config.shutdown_grace_s)
        _log.info("agentk_stopped")

    async def _start(self, stack: contextlib.AsyncExitStack, api: AgentApi, modules: list[Module]) -> None:
        """Start in upstream's order (module docstring); ``stack`` stops everything in reverse."""
        supervisor, internal = self.supervisor, api.internal_server
        stack.push_async_callback(supervisor.cancel_loops)
        stack.push_async_callback(supervisor.stop_modules)
        await internal.start()
        stack.push_async_callback(internal.stop, 1.0)
        _log.info("internal_server_started", services=[s.name for s in internal.descriptor().services])
        await supervisor.start(modules)
        web_runner = await self._start_observability()
        stack.push_async_callback(web_runner.cleanup)
        self._start_tunnels(stack, api)
        agent_meta = build_agent_meta(await _kube_version(api.kube))
        api.pod_namespace, api.pod_name = agent_meta.pod_namespace, agent_meta.pod_name
        assert api.kas is not None
        self._watcher = ConfigurationWatcher(
            api.kas, agent_meta, self._on_configuration, metadata=api.kas_metadata, on_stream_end=self._on_stream_end
        )
        # The watcher retries on its own; a crash of the loop itself is logged, counted and restarted.
        watcher_task = supervisor.spawn("configuration-watcher", self._watcher.run)
        stack.push_async_callback(_cancel_and_wait, watcher_task)  # first to stop: no configuration after
        set_process_fields(kas_url=self._config.kas.target)
        freeze_startup_heap()
        _log.info("agentk_started", version=__version__, kas=self._config.kas.target, pod=agent_meta.pod_name)

    def _start_tunnels(self, stack: contextlib.AsyncExitStack, api: AgentApi) -> None:
        """The reverse tunnel pool, after the servers: the descriptor lists every registered API."""
        internal, kas_channel = api.internal_server, api.kas
        assert kas_channel is not None
        descriptor = internal.descriptor()

        def new_connection(listener: TunnelListener) -> PooledConnection:
            return TunnelConnection(
                kas_channel,
                internal.handler,
                descriptor,
                listener,
                metadata=api.kas_metadata,
                connected=self._connected,
            )

        self._pool = ConnectionPool(new_connection)
        self._pool.start()
        stack.push_async_callback(self._pool.stop, self._config.shutdown_grace_s)

    def _on_configuration(self, configuration: agentcfg_pb2.AgentConfiguration) -> None:
        # kas.md §6.3 "Apply": every module that subscribed sees each new configuration.
        set_process_fields(agent_id=configuration.agent_id)
        if self._api is not None:
            for callback in self._api.configuration_callbacks:
                callback(configuration)

    def _on_stream_end(self) -> None:
        if self._api is not None:
            for callback in self._api.stream_end_callbacks:
                callback()

    def _kas_channel(self) -> aio.Channel:
        config = self._config
        options = [*config.channel_options(), ("grpc.primary_user_agent", f"tether-agentk/{__version__}")]
        if config.kas.tls:
            credentials = grpc.ssl_channel_credentials(root_certificates=config.ca_cert)
            return aio.secure_channel(config.kas.target, credentials, options=options)
        return aio.insecure_channel(config.kas.target, options=options)

    async def _start_observability(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/liveness", self._liveness)
        app.router.add_get("/readiness", self._readiness)
        runner = SafeAppRunner(app, access_log=None)
        await runner.setup()
        host = self._config.observability_host or None
        site = web.TCPSite(runner, host, self._config.observability_port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        _log.info("observability_listening", host=host or "*", port=self._config.observability_port)
        return runner

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _liveness(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readiness(self, _request: web.Request) -> web.Response:
        # Like upstream's probes (kas.md §8.5): 500 with the reason when not ready.
        reason = self.readiness()
        return web.Response(text="ok\n") if reason is None else web.Response(status=500, text=reason + "\n")

    def _register_metrics(self) -> None:
        gauges = {
            "tether_agentk_tunnels_idle": ("Reverse tunnel connections waiting for a request.", "idle"),
            "tether_agentk_tunnels_active": ("Reverse tunnel connections carrying a request.", "active"),
        }
        for name, (help_text, field) in gauges.items():
            Gauge(name, help_text, registry=self.registry).set_function(functools.partial(self._pool_count, field))
        Gauge(
            "tether_agentk_tunnels_connected", "Reverse tunnels with an open Connect stream.", registry=self.registry
        ).set_function(lambda: float(self._connected.value))

    def _pool_count(self, field: str) -> float:
        return float(getattr(self._pool.stats, field)) if self._pool is not None else 0.0


def _stop_on_signals() -> asyncio.Event:
    """An event set on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait({task})


async def _kube_version(kube: KubeClient) -> ServerVersion | None:
    try:
        return await asyncio.wait_for(kube.server_version(), KUBE_VERSION_TIMEOUT_S)
    except (KubeError, TimeoutError) as exc:
        _log.warning("kubernetes_version_unavailable", error=str(exc))
        return None
