"""The hub's client for kas' api listener (seed 000 "GitLab -> kas endpoint").

Every call carries ``authorization: Bearer <JWT>`` with ``iss=gitlab``, ``aud=gitlab-kas``, signed with the
api secret shared with kas (kas.md §4.2).

A token revocation is delivered until a kas acknowledges it (:meth:`KasApiClient.announce_revocation`, issue
27 item 6): one missed call used to leave the token working on every kas for their whole info cache TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc
from prometheus_client import Gauge

from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2 as tokens_pb2
from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2_grpc as tokens_grpc
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2 as tracker_pb2
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2_grpc as tracker_grpc
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2 as pods_pb2
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2_grpc as pods_grpc
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2 as workspaces_pb2
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2_grpc as workspaces_grpc
from tether.tool import tracing
from tether.tool.backoff import Backoff
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, SecondSigner
from tether.tool.secrets import load_base64_secret

if TYPE_CHECKING:
    from tether.hub.config import HubConfig

log = logging.getLogger(__name__)
DELIVERIES = Gauge(
    "tether_hub_revocation_deliveries", "Token revocations this hub is delivering to kas in the background now"
)
_JWT_LIFETIME_S = 60.0
#: Seconds the hub keeps retrying a revocation no kas acknowledged. Past them (or when the hub stops) kas still
#: refuses the token once its cached answer expires (``agent.info_cache_ttl``) and ends its tunnels at the next
#: re-validation after that (``agent.token_revalidation_period``).
REVOCATION_RETRY_FOR_S = 900.0
#: Revocations one hub delivers in the background at once. Each is a task retrying for up to
#: :data:`REVOCATION_RETRY_FOR_S`; past the bound a revocation is left to the hubs' sweeps (still in the outbox),
#: so a maintainer revoking tokens in a loop while kas is away costs the hub no more than this many tasks.
MAX_DELIVERIES = 64
#: Answers that no retry can change: the call itself is wrong.
FINAL_CODES = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED}
)


def client_for(config: HubConfig) -> KasApiClient | None:
    """The client for ``config.kas.api_address``, or None when the hub is not told where kas is.

    Raises:
        OSError, ValueError: the kas secret file or CA certificate cannot be read.
    """
    if config.kas.api_address is None:
        return None
    secret = load_base64_secret(config.kas_secret_file)
    credentials = None
    if config.kas.ca_certificate_file is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=config.kas.ca_certificate_file.read_bytes())
    return KasApiClient(config.kas.api_address, secret, credentials)


class KasApiClient:
    """Calls kas' api listener.

    Args:
        target: ``host:port`` of the api listener.
        secret: the api JWT secret (decoded bytes).
        credentials: TLS channel credentials, or None for plaintext.
    """

    def __init__(self, target: str, secret: bytes, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._jwt = SecondSigner(secret, ISSUER_GITLAB, AUDIENCE_KAS, _JWT_LIFETIME_S)
        # With tracing on, every call is a client span whose context kas receives (issue 25 item 3).
        tracer = tracing.TRACER
        interceptors = None if tracer is None else [tracer.grpc_client_interceptor("hub")]
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, interceptors=interceptors)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, interceptors=interceptors)
        self._tracker = tracker_grpc.AgentTrackerStub(self._channel)
        self._pods = pods_grpc.PodsStub(self._channel)
        self._tokens = tokens_grpc.AgentTokensStub(self._channel)
        self._workspaces = workspaces_grpc.WorkspaceAccessApiStub(self._channel)
        self._deliveries: set[asyncio.Task[bool]] = set()

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer " + self._jwt.token()),)

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

    def announce_revocation(
        self, agent_id: int, digests_hex: list[str], timeout_s: float, retry_for_s: float = REVOCATION_RETRY_FOR_S
    ) -> asyncio.Task[bool] | None:
        """Deliver a revocation in the background, retrying until a kas acknowledges it (issue 27 item 6).

        kas acknowledges once the revocation is on its list in Redis, which every kas re-reads. Each failed
        attempt is logged (warning) and retried after a backoff of 0.5 s growing to 10 s; after ``retry_for_s``
        seconds, or on an answer no retry can change (INVALID_ARGUMENT, UNAUTHENTICATED, UNIMPLEMENTED), the
        delivery is given up with an error in the log.

        Args:
            agent_id: the tokens' agent.
            digests_hex: the tokens' SHA-256 digests, lowercase hex.
            timeout_s: deadline of each attempt in seconds (``kas.timeout``).
            retry_for_s: seconds to keep retrying.

        Returns:
            The delivery: True once acknowledged, False when given up; None when :data:`MAX_DELIVERIES` are under
            way already (the caller leaves the revocation to the sweeps).
        """
        if len(self._deliveries) >= MAX_DELIVERIES:
            return None
        task = asyncio.get_running_loop().create_task(
            self.deliver_revocation(agent_id, digests_hex, timeout_s, retry_for_s)
        )
        self._deliveries.add(task)
        DELIVERIES.inc()
        task.add_done_callback(self._delivered)
        return task

    def _delivered(self, task: asyncio.Task[bool]) -> None:
        self._deliveries.discard(task)
        DELIVERIES.dec()

    async def deliver_revocation(
        self, agent_id: int, digests_hex: list[str], timeout_s: float, retry_for_s: float
    ) -> bool:
        """Deliver a revocation now, retrying as :meth:`announce_revocation` does; True once acknowledged."""
        give_up_at = time.monotonic() + retry_for_s
        backoff = Backoff(initial_s=0.5, max_s=10.0, jitter=0.2)
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.revoke_agent_tokens(agent_id, digests_hex, timeout_s)
            except grpc.aio.AioRpcError as exc:
                delay = backoff.next_delay()
                if exc.code() in FINAL_CODES or time.monotonic() + delay > give_up_at:
                    log.error(
                        "kas api: revocation of %d token(s) of agent %d not delivered after %d attempt(s): %s; "
                        "kas refuses them once its cached answers expire (agent.info_cache_ttl)",
                        len(digests_hex),
                        agent_id,
                        attempt,
                        exc.code().name,
                    )
                    return False
                log.warning(
                    "kas api: announcing %d revoked token(s) of agent %d failed (attempt %d): %s; again in %.1f s",
                    len(digests_hex),
                    agent_id,
                    attempt,
                    exc.code().name,
                    delay,
                )
                await asyncio.sleep(delay)
            else:
                if attempt > 1:
                    log.info("kas api: revocation of agent %d's tokens delivered at attempt %d", agent_id, attempt)
                return True

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
        """Give up the revocations still being delivered (logged), then close the channel."""
        if self._deliveries:
            log.error("kas api: the hub stops with %d revocation(s) not delivered", len(self._deliveries))
            for task in list(self._deliveries):
                task.cancel()
            await asyncio.gather(*self._deliveries, return_exceptions=True)
        await self._channel.close()
