"""The hub's client for kas' api listener (seed 000 "GitLab -> kas endpoint").

Every call carries ``authorization: Bearer <JWT>`` with ``iss=gitlab``, ``aud=gitlab-kas``, signed with the
api secret shared with kas (kas.md §4.2).
"""

from __future__ import annotations

import grpc

from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2 as tokens_pb2
from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2_grpc as tokens_grpc
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2 as tracker_pb2
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2_grpc as tracker_grpc
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2 as pods_pb2
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2_grpc as pods_grpc
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2 as workspaces_pb2
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2_grpc as workspaces_grpc
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, mint

_JWT_LIFETIME_S = 60.0


class KasApiClient:
    """Calls kas' api listener.

    Args:
        target: ``host:port`` of the api listener.
        secret: the api JWT secret (decoded bytes).
        credentials: TLS channel credentials, or None for plaintext.
    """

    def __init__(self, target: str, secret: bytes, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._secret = secret
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials)
        self._tracker = tracker_grpc.AgentTrackerStub(self._channel)
        self._pods = pods_grpc.PodsStub(self._channel)
        self._tokens = tokens_grpc.AgentTokensStub(self._channel)
        self._workspaces = workspaces_grpc.WorkspaceAccessApiStub(self._channel)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer " + mint(self._secret, ISSUER_GITLAB, AUDIENCE_KAS, _JWT_LIFETIME_S)),)

    async def connected_agents_by_agent_id(self, agent_id: int, timeout_s: float = 10.0) -> list[ConnectedAgentInfo]:
        """Every connection of agent ``agent_id``. Raises grpc.aio.AioRpcError."""
        request = tracker_pb2.GetConnectedAgentsRequest(agent_id=agent_id)
        response = await self._tracker.GetConnectedAgents(request, metadata=self._metadata(), timeout=timeout_s)
        return list(response.agents)

    async def connected_agents_by_project_id(
        self, project_id: int, timeout_s: float = 10.0
    ) -> list[ConnectedAgentInfo]:
        """Every connection of every agent of project ``project_id``. Raises grpc.aio.AioRpcError."""
        request = tracker_pb2.GetConnectedAgentsRequest(project_id=project_id)
        response = await self._tracker.GetConnectedAgents(request, metadata=self._metadata(), timeout=timeout_s)
        return list(response.agents)

    async def get_pods(self, agent_id: int, timeout_s: float = 30.0) -> list[pods_pb2.Pod]:
        """The pods of agent ``agent_id``'s cluster, routed to the agent. Raises grpc.aio.AioRpcError."""
        response = await self._pods.GetPods(
            pods_pb2.GetPodsRequest(agent_id=agent_id), metadata=self._metadata(), timeout=timeout_s
        )
        return list(response.pods)

    async def revoke_agent_tokens(self, agent_id: int, digests_hex: list[str], timeout_s: float = 10.0) -> None:
        """Tell every kas (through this one and Redis) that these agent tokens are revoked.

        Args:
            agent_id: the tokens' agent.
            digests_hex: the tokens' SHA-256 digests, lowercase hex as the database keeps them.
            timeout_s: deadline of the call in seconds.

        Raises:
            grpc.aio.AioRpcError: kas refused or is unreachable.
        """
        request = tokens_pb2.RevokeAgentTokensRequest(
            agent_id=agent_id, token_sha256=[bytes.fromhex(d) for d in digests_hex]
        )
        await self._tokens.RevokeAgentTokens(request, metadata=self._metadata(), timeout=timeout_s)

    async def invalidate_workspaces(self, names: list[str], timeout_s: float = 10.0) -> None:
        """Tell every kas (through this one and Redis) that these workspaces changed (state, existence).

        Args:
            names: workspace names, at most 1,000.
            timeout_s: deadline of the call in seconds.

        Raises:
            grpc.aio.AioRpcError: kas refused or is unreachable.
        """
        request = workspaces_pb2.InvalidateWorkspacesRequest(names=names)
        await self._workspaces.InvalidateWorkspaces(request, metadata=self._metadata(), timeout=timeout_s)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()
