"""The Kubernetes API proxy module (kas.md §5); imported by its factory only when ``agent.kubernetes_api`` is set."""

from __future__ import annotations

import asyncio

from tether.modserver.api import ServerApi
from tether.modshared.module import ModuleStartError
from tether.modules import audit
from tether.modules.kubernetes_api.server.auth import ProxyUserAuthorizer
from tether.modules.kubernetes_api.server.config import KubernetesApiCF
from tether.modules.kubernetes_api.server.proxy import KubernetesApiProxy
from tether.modules.kubernetes_api.server.usage import ProxyUsage


class KubernetesApiServerModule:
    """Runs the proxy listener at ``agent.kubernetes_api.listen``.

    Args:
        config: the ``agent.kubernetes_api`` section.
        api: kas' module API (agent connection, hub client, ``ports``).
    """

    name = "kubernetes_api"

    def __init__(self, config: KubernetesApiCF, api: ServerApi) -> None:
        self._config = config
        self._api = api
        authorizer = ProxyUserAuthorizer(
            api.gitlab, config.allowed_agent_cache_ttl, config.allowed_agent_cache_error_ttl
        )
        usage = ProxyUsage()
        api.metrics.register(usage)
        self._proxy = KubernetesApiProxy(
            config,
            api.agent_conn,
            authorizer,
            api.config.gitlab.external_url,
            api.rate_limiter,
            api.proxy_paths,
            usage,
            audit=api.audit,
            gitlab=api.gitlab,
            recording_budget=audit.RecordingBudget(config.session_recording_max_total_bytes, api.metrics),
        )

    async def start(self) -> None:
        """Bind the listener and record its port as ``api.ports["kubernetes_api"]``.

        Raises:
            ModuleStartError: the address cannot be bound or the certificate cannot be loaded.
        """
        try:
            self._api.ports[self.name] = await self._proxy.start()
        except (OSError, ValueError) as exc:
            raise ModuleStartError(
                f"kubernetes_api listener cannot listen on {self._config.listen.address}: {exc}"
            ) from exc

    async def stop(self) -> None:
        """Keep accepting for ``listen_grace_period`` (load balancers notice), then stop with grace."""
        await asyncio.sleep(self._config.listen.listen_grace_period)
        await self._proxy.stop()
