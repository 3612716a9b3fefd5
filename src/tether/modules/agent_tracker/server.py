"""``AgentTracker.GetConnectedAgents`` on the api listener: connected agents by project or agent id.

This is the seed's ``ConnectedAgentsForProject`` / ``ConnectedAgentsById`` pair under upstream's name
(kas.md §3.3): one RPC with a ``oneof`` of ``project_id`` and ``agent_id``.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.api import ServerApi
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2, rpc_pb2_grpc

log = logging.getLogger(__name__)


class AgentTrackerServicer(rpc_pb2_grpc.AgentTrackerServicer):
    """Answers connected-agents queries from the tracker; storage errors become ``UNAVAILABLE``."""

    def __init__(self, tracker: AgentTracker) -> None:
        self._tracker = tracker

    async def GetConnectedAgents(
        self, request: rpc_pb2.GetConnectedAgentsRequest, context: Any
    ) -> rpc_pb2.GetConnectedAgentsResponse:
        """Return every connection of the agent, or of every agent of the project."""
        which = request.WhichOneof("request")
        try:
            if which == "project_id":
                agents = await self._tracker.connections_by_project_id(request.project_id)
            elif which == "agent_id":
                agents = await self._tracker.connections_by_agent_id(request.agent_id)
            else:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "set project_id or agent_id")
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("connected agents query failed")
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"connected agents unavailable: {exc}")
        return rpc_pb2.GetConnectedAgentsResponse(agents=agents)


class AgentTrackerServerFactory:
    """kas half of ``agent_tracker``: ``GetConnectedAgents`` on the api listener."""

    name = "agent_tracker"

    def new(self, api: ServerApi) -> Module:
        """Register ``AgentTracker`` on the api listener."""
        rpc_pb2_grpc.add_AgentTrackerServicer_to_server(AgentTrackerServicer(api.agent_tracker), api.api_server)
        return IdleModule(self.name)
