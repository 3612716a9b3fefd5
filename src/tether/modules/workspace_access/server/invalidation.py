"""The hub tells kas which workspaces changed; every kas then forgets what it knew about them.

``WorkspaceAccessApi.InvalidateWorkspaces`` on the api listener (JWT ``iss=gitlab``, checked by the listener)
publishes ``WorkspacesInvalidated`` on the event bus, and every kas, the publisher included, drops its cached
answers about those workspaces (the same path as agent token revocation). Without Redis or with the event lost,
the answers still expire after ``authorization_cache_ttl``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import grpc

from tether.modules.workspace_access.server.authorizer import WorkspaceAuthorizer
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2, rpc_pb2_grpc
from tether.tool.events import EventBus

__all__ = ["MAX_NAMES", "WorkspaceAccessApiServicer", "subscribe_invalidations"]

log = logging.getLogger(__name__)

#: Most names one call may carry (bounds the event).
MAX_NAMES = 1000
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class WorkspaceAccessApiServicer(rpc_pb2_grpc.WorkspaceAccessApiServicer):
    """Serves ``InvalidateWorkspaces`` for the hub.

    Args:
        events: the bus every kas listens on.
    """

    def __init__(self, events: EventBus) -> None:
        self._events = events

    async def InvalidateWorkspaces(
        self, request: rpc_pb2.InvalidateWorkspacesRequest, context: Any
    ) -> rpc_pb2.InvalidateWorkspacesResponse:
        """Publish the change to every kas.

        Raises:
            grpc.aio.AbortError: INVALID_ARGUMENT for too many names or one that is not a workspace name;
                UNAVAILABLE when the event cannot be published.
        """
        names = list(request.names)
        if len(names) > MAX_NAMES or not all(_NAME.fullmatch(name) for name in names):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"names: at most {MAX_NAMES} workspace names (DNS labels)"
            )
        try:
            await self._events.publish(rpc_pb2.WorkspacesInvalidated(names=names))
        except Exception as exc:
            log.warning("publishing a workspace change failed: %r", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the change could not be published to every kas")
        return rpc_pb2.InvalidateWorkspacesResponse()


def subscribe_invalidations(events: EventBus, authorizer: WorkspaceAuthorizer) -> None:
    """Apply every ``WorkspacesInvalidated`` event of the bus to ``authorizer``."""

    def apply(event: rpc_pb2.WorkspacesInvalidated) -> None:
        dropped = authorizer.invalidate(event.names)
        log.debug("workspaces changed: %d names, %d cached answers dropped", len(event.names), dropped)

    events.on(rpc_pb2.WorkspacesInvalidated, apply)
