"""kas half of ``workspace_access``: the workspaces listener, started when ``workspaces`` is configured."""

from __future__ import annotations

from tether.modserver.api import ServerApi
from tether.modshared.module import Module
from tether.modules.workspace_access import MODULE_NAME
from tether.modules.workspace_access.server.config import WorkspacesCF
from tether.modules.workspace_access.server.invalidation import WorkspaceAccessApiServicer
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2_grpc

__all__ = ["WorkspaceAccessServerFactory"]


class WorkspaceAccessServerFactory:
    """Builds the module when the ``workspaces`` section is configured."""

    name = MODULE_NAME

    def new(self, api: ServerApi) -> Module | None:
        """The module, or None without a ``workspaces`` section.

        ``InvalidateWorkspaces`` is served either way: the hub may call any kas, and the event reaches them all.
        """
        rpc_pb2_grpc.add_WorkspaceAccessApiServicer_to_server(WorkspaceAccessApiServicer(api.events), api.api_server)
        config = api.section(WorkspacesCF)
        if config is None:
            return None
        # Imported here: a kas without workspaces does not load the listener (tests/e2e/test_minimal_imports.py).
        from tether.modules.workspace_access.server.module import WorkspaceAccessServerModule  # noqa: PLC0415

        return WorkspaceAccessServerModule(config, api)
