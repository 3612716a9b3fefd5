"""kas half of ``kubernetes_api``: the Kubernetes API proxy listener (kas.md §5), started when configured."""

from __future__ import annotations

from tether.modserver.api import ServerApi
from tether.modshared.module import Module
from tether.modules.kubernetes_api.server.config import KubernetesApiCF


class KubernetesApiServerFactory:
    """Builds the proxy module when ``agent.kubernetes_api`` is configured."""

    name = "kubernetes_api"

    def new(self, api: ServerApi) -> Module | None:
        """The proxy module, or None without an ``agent.kubernetes_api`` section."""
        config = api.section(KubernetesApiCF)
        if config is None:
            return None
        # Imported here: a kas without the proxy does not load it (issue 28 item 4, tests/e2e/test_minimal_imports.py).
        from tether.modules.kubernetes_api.server.module import KubernetesApiServerModule  # noqa: PLC0415

        return KubernetesApiServerModule(config, api)
