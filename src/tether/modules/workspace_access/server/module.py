"""The workspaces listener module; imported by its factory only when ``workspaces`` is configured."""

from __future__ import annotations

import asyncio

from tether.modserver.api import ServerApi
from tether.modshared.module import ModuleStartError
from tether.modules.workspace_access import HUB_SIGN_IN_PATH, MODULE_NAME
from tether.modules.workspace_access.server.authorizer import WorkspaceAuthorizer
from tether.modules.workspace_access.server.config import WorkspacesCF
from tether.modules.workspace_access.server.invalidation import subscribe_invalidations
from tether.modules.workspace_access.server.pages import WorkspaceStatePage
from tether.modules.workspace_access.server.proxy import WorkspaceProxy
from tether.modules.workspace_access.server.sign_in import SignIn
from tether.tool.secrets import load_base64_secret


class WorkspaceAccessServerModule:
    """Runs the workspaces listener at ``workspaces.listen``.

    Args:
        config: the ``workspaces`` section.
        api: kas' module API.
    """

    name = MODULE_NAME

    def __init__(self, config: WorkspacesCF, api: ServerApi) -> None:
        self._config = config
        self._api = api
        secret = load_base64_secret(api.config.gitlab.authentication_secret_file, exact_length=32)
        hub = (api.config.gitlab.external_url or api.config.gitlab.address).rstrip("/")
        authorizer = WorkspaceAuthorizer(
            api.gitlab, config.authorization_cache_ttl, config.authorization_cache_error_ttl
        )
        subscribe_invalidations(api.events, authorizer)
        self._proxy = WorkspaceProxy(
            config,
            api.agent_conn,
            api.agent_tracker,
            authorizer,
            SignIn(secret, config.sign_in_url or hub + HUB_SIGN_IN_PATH),
            WorkspaceStatePage(f"{hub}/workspaces", f"{hub}/api/graphql"),
            secret,
            api.rate_limiter,
            api.audit,
        )

    async def start(self) -> None:
        """Bind the listener and record its port as ``api.ports["workspaces"]``.

        Raises:
            ModuleStartError: the address cannot be bound or the certificate cannot be loaded.
        """
        try:
            self._api.ports["workspaces"] = await self._proxy.start()
        except (OSError, ValueError) as exc:
            raise ModuleStartError(
                f"workspaces listener cannot listen on {self._config.listen.address}: {exc}"
            ) from exc

    async def stop(self) -> None:
        """Keep accepting for ``listen_grace_period`` (load balancers notice), then stop with grace."""
        await asyncio.sleep(self._config.listen.listen_grace_period)
        await self._proxy.stop()
