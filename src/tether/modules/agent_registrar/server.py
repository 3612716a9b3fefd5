"""kas' ``AgentRegistrar.Register``: one agent tracker entry per agentk pod, refreshed by each call (kas.md §3.3).

The entry is the same ``ConnectedAgentInfo`` the configuration stream registers, with the pod's ``pod_id`` as
connection id, so the hub lists upstream agentk (which sends ``skip_register = true`` on its configuration
stream) and Tether agentk alike. kas does not refresh it: the pod's next call does, else it expires.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from tether.modserver.agent_auth import AgentAuthenticator, AuthError
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.api import ServerApi
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.agent_registrar.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.tool.logs import bind_for_task

log = logging.getLogger(__name__)

#: Bounds on what a pod may store about itself (bytes of the serialized ``AgentMeta``).
MAX_AGENT_META_BYTES = 4096
#: Pods one agent may have registered at once: a token holder cannot fill the store with invented pod ids.
MAX_PODS_PER_AGENT = 1000


class AgentRegistrarServicer(rpc_pb2_grpc.AgentRegistrarServicer):
    """Serves ``Register`` on kas' agent listener.

    Args:
        auth: resolves the agent token of each call.
        tracker: where the pod's entry is written.
        max_pods: registered pods per agent beyond which a new pod id is refused.
        stopping: set when kas shuts down: registrations are then refused (``UNAVAILABLE``) so none is written
            after kas deleted its entries; the pod registers through another kas.
    """

    def __init__(
        self,
        auth: AgentAuthenticator,
        tracker: AgentTracker,
        max_pods: int = MAX_PODS_PER_AGENT,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self._auth = auth
        self._tracker = tracker
        self._max_pods = max_pods
        self._stopping = stopping or asyncio.Event()

    async def Register(self, request: rpc_pb2.RegisterRequest, context: Any) -> rpc_pb2.RegisterResponse:
        """Create or refresh the pod's entry.

        Errors: the token's (``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``NOT_FOUND``); ``INVALID_ARGUMENT``
        for a missing ``pod_id`` or an oversized ``agent_meta``; ``RESOURCE_EXHAUSTED`` for a new pod of an agent
        that already has ``max_pods``; ``UNAVAILABLE`` when the store fails (upstream answers
        ``Unavailable "Failed to register agent"`` too).
        """
        if self._stopping.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kas is shutting down")
        try:
            agent = await self._auth.authenticate(context.invocation_metadata())
        except AuthError as exc:
            await context.abort(exc.code, exc.message)
        if request.pod_id == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pod_id is required")
        if request.agent_meta.ByteSize() > MAX_AGENT_META_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"agent_meta is larger than {MAX_AGENT_META_BYTES} bytes"
            )
        bind_for_task(connection_id=request.pod_id)  # the pod id is the connection id (kas.md §3.3)
        connected_at = Timestamp()
        connected_at.GetCurrentTime()
        info = ConnectedAgentInfo(
            agent_meta=request.agent_meta,
            connected_at=connected_at,
            connection_id=request.pod_id,
            agent_id=agent.agent_id,
            project_id=agent.project_id,
        )
        try:
            known = await self._tracker.connections_by_agent_id(agent.agent_id)
            if len(known) >= self._max_pods and all(c.connection_id != request.pod_id for c in known):
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"agent has {len(known)} registered pods, the maximum"
                )
            await self._tracker.register_pod(info)
            log.debug("registered agentk pod", extra={"pod_name": request.agent_meta.pod_name})
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("registering agentk pod failed", extra={"agent_id": agent.agent_id})
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Failed to register agent")
        return rpc_pb2.RegisterResponse()


class AgentRegistrarServerFactory:
    """kas half of ``agent_registrar``: ``Register`` on the agent listener."""

    name = "agent_registrar"

    def new(self, api: ServerApi) -> Module:
        """Register ``AgentRegistrar`` on the agent listener."""
        servicer = AgentRegistrarServicer(api.auth, api.agent_tracker, stopping=api.stopping)
        rpc_pb2_grpc.add_AgentRegistrarServicer_to_server(servicer, api.agent_server)
        return IdleModule(self.name)
