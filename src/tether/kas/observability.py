"""kas' observability listener: ``/metrics`` (Prometheus), ``/liveness`` and ``/readiness`` (kas.md §8.5).

A service like the others: :func:`kas_gauges` are kas' own gauges, :class:`ObservabilityServer` the listener.

Readiness is true only when every probe passes: the state backend answers ``PING`` and every listener is
up. A failing probe answers 503 with the reason, so an orchestrator's log shows what is wrong.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tether.modserver.config import ObservabilityCF
from tether.tool.http_server import SafeAppRunner

#: A readiness probe returns None when healthy, else a short reason.
Probe = Callable[[], Awaitable[str | None]]


class GaugeCollector(Collector):
    """Reports gauges computed on scrape from ``values`` (name to (help, value function))."""

    def __init__(self, values: dict[str, tuple[str, Callable[[], float]]]) -> None:
        self._values = values

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield one gauge per configured value."""
        for name, (help_text, value) in self._values.items():
            yield GaugeMetricFamily(name, help_text, value=value())


def kas_gauges(
    idle_tunnels: Callable[[], int], waiting_requests: Callable[[], int], connected_agents: Callable[[], float]
) -> GaugeCollector:
    """Kas' gauges (upstream's names): idle tunnels and waiting requests here, connected agents everywhere."""
    return GaugeCollector(
        {
            "tunnels_idle": ("Idle reverse tunnels held by this kas", lambda: float(idle_tunnels())),
            "tunnel_find_requests_waiting": (
                "Requests waiting for a tunnel on this kas",
                lambda: float(waiting_requests()),
            ),
            "connected_agents_count": ("Connected agents (all kas instances)", connected_agents),
        }
    )


class BuildInfo(Collector):
    """``gitlab_build_info{version, built} 1``: upstream kas' build gauge (``cmd/kas/kasapp/configured_app.go``).

    Args:
        version: the kas version.
        built: when or from what it was built (upstream: the build time; here the commit given to kas, or empty).
    """

    def __init__(self, version: str, built: str) -> None:
        self._labels = [version, built]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The one series, value 1."""
        family = GaugeMetricFamily(
            "gitlab_build_info", "Current build info for this GitLab Service", labels=["version", "built"]
        )
        family.add_metric(self._labels, 1)
        yield family


class ObservabilityServer:
    """The HTTP server; ``registry`` holds this process' own gauges next to the global metrics.

    Args:
        config: the ``observability`` section.
        probes: readiness probes.
        registry: extra metrics of this kas.
    """

    def __init__(self, config: ObservabilityCF, probes: list[Probe], registry: CollectorRegistry) -> None:
        self._config = config
        self._probes = probes
        self._registry = registry
        self._runner: web.AppRunner | None = None
        app = web.Application()
        app.router.add_get(config.prometheus.url_path, self._metrics)
        app.router.add_get(config.liveness_probe.url_path, self._liveness)
        app.router.add_get(config.readiness_probe.url_path, self._readiness)
        self._app = app

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(REGISTRY) + generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _liveness(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readiness(self, _request: web.Request) -> web.Response:
        for probe in self._probes:
            try:
                problem = await probe()
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if problem is not None:
                return web.Response(status=503, text=f"not ready: {problem}")
        return web.Response(text="ok")

    async def start(self) -> None:
        """Start listening on the configured address (``host:port``)."""
        self._runner = SafeAppRunner(self._app, access_log=None)
        await self._runner.setup()
        host, _, port = self._config.listen.address.rpartition(":")
        await web.TCPSite(self._runner, host or "0.0.0.0", int(port)).start()

    async def stop(self) -> None:
        """Stop the HTTP server."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
