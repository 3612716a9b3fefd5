"""Agent token revocation across every kas (issues 9 item 7, 27 item 6; Tether's own, upstream waits for its cache).

The hub calls ``AgentTokens/RevokeAgentTokens`` on kas' api listener with the SHA-256 digests of the revoked
tokens (it keeps nothing else) and retries until a kas acknowledges (``tether.hub.kas_client``). That kas

1. revokes the tokens in its own process at once;
2. adds them to the revocation list in Redis (:class:`RevocationList`): only then does it acknowledge, so a
   call that could not record them is retried by the hub;
3. publishes ``AgentTokenRevoked`` on the event bus; every kas receives it and calls
   ``AgentAuthenticator.revoke``: the tokens are forgotten and refused, and the tunnels and configuration
   streams opened with them are cancelled.

A kas that missed the event (frozen, or its subscription cut while it was published) finds the tokens on the
list when it re-validates (:func:`revalidate_forever`, every ``agent.token_revalidation_period``). List
entries live :func:`list_ttl_s`, longer than any cached answer they must override.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable
from typing import Any

import grpc

from tether.modserver.agent_auth import AgentAuthenticator
from tether.modserver.config import AgentCF
from tether.modshared.module import Spawner
from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.event.event_pb2 import AgentTokenRevoked
from tether.pb.gitlab.agent.redistool.redistool_pb2 import ExpiringValue
from tether.tool.events import EventBus
from tether.tool.expiring_hash import HashBackend, expired_fields, expires_at_for

__all__ = [
    "AgentTokensServicer",
    "RevocationList",
    "TokenRevocationService",
    "list_ttl_s",
    "revalidate_forever",
    "subscribe_revocations",
]

log = logging.getLogger(__name__)

#: Most digests one call may carry (an agent has a handful of tokens; this bounds the event size).
MAX_DIGESTS = 1000
#: Shortest life of a revocation list entry, in seconds.
MIN_LIST_TTL_S = 3600.0
#: Seconds a revocation waits for Redis replicas to acknowledge it (``WAIT``) before it is refused and retried.
REPLICATION_TIMEOUT_S = 1.0
#: Seconds a re-validation round waits for the list before it goes on without it (Redis stalled).
LIST_READ_TIMEOUT_S = 5.0


def list_ttl_s(info_cache_ttl_s: float, revalidation_period_s: float) -> float:
    """Seconds a revocation list entry lives.

    At least :data:`MIN_LIST_TTL_S`, and at least twice as long as a cached answer (``agent.info_cache_ttl``) or a
    re-validation period, so every kas that could still trust the token re-validates while the entry is there.
    """
    return max(MIN_LIST_TTL_S, 2 * info_cache_ttl_s, 2 * revalidation_period_s)


class RevocationList:
    """Revoked token digests in Redis (or memory without Redis), shared by every kas.

    Key ``<prefix>:agent_tokens_revoked``: a hash whose fields are digests in lowercase hex and whose values are
    ``ExpiringValue{expires_at}`` (the expiring-hash format of kas.md §3.1); every write also sets the key's
    expiry, so the list disappears by itself when no token was revoked for ``ttl_s``.

    Args:
        backend: the shared store.
        key_prefix: ``redis.key_prefix``.
        ttl_s: life of an entry in seconds (:func:`list_ttl_s`).

    Errors are the backend's (``redis.exceptions.RedisError``, ``OSError``).
    """

    def __init__(self, backend: HashBackend, key_prefix: str, ttl_s: float) -> None:
        self._backend = backend
        self._key = f"{key_prefix}:agent_tokens_revoked".encode()
        self._ttl_s = ttl_s

    async def add(self, digests: Iterable[bytes]) -> None:
        """Record the digests (32 bytes each) as revoked for ``ttl_s`` seconds, on the master and every replica.

        An entry only the master had would be lost if a replica were promoted (Sentinel failover): the hub would
        have its acknowledgement and never retry, and a kas that missed the event would trust the token until its
        cached answer expired.

        Raises:
            NotReplicated: a replica did not acknowledge within :data:`REPLICATION_TIMEOUT_S` (the hub retries).
        """
        value = ExpiringValue(expires_at=expires_at_for(time.time(), self._ttl_s)).SerializeToString()
        fields = {digest.hex(): value for digest in digests}
        if fields:
            await self._backend.set_fields_replicated([(self._key, fields)], self._ttl_s, REPLICATION_TIMEOUT_S)

    async def read(self) -> set[bytes]:
        """Every digest still on the list; expired entries are skipped and deleted."""
        raw = await self._backend.scan(self._key)
        expired = set(expired_fields(raw, time.time()))
        if expired:
            await self._backend.gc(self._key, time.time())
        return {bytes.fromhex(name) for name in raw if name not in expired and len(name) == 64}


class AgentTokensServicer(rpc_pb2_grpc.AgentTokensServicer):
    """Serves ``/gitlab.agent.agent_tokens.rpc.AgentTokens/RevokeAgentTokens`` (JWT checked by the listener).

    Args:
        events: the bus every kas listens on.
        auth: this kas' authenticator.
        revocations: the revocation list.
    """

    def __init__(self, events: EventBus, auth: AgentAuthenticator, revocations: RevocationList) -> None:
        self._events = events
        self._auth = auth
        self._revocations = revocations

    async def RevokeAgentTokens(
        self, request: rpc_pb2.RevokeAgentTokensRequest, context: Any
    ) -> rpc_pb2.RevokeAgentTokensResponse:
        """Revoke here, record on the list, publish to every kas; answer OK once the list has them.

        Raises:
            grpc.aio.AbortError: INVALID_ARGUMENT for a digest that is not 32 bytes or too many digests;
                UNAVAILABLE when the list cannot be written (the hub retries).
        """
        if len(request.token_sha256) > MAX_DIGESTS or any(len(d) != 32 for d in request.token_sha256):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"token_sha256: at most {MAX_DIGESTS} SHA-256 digests of 32 bytes"
            )
        digests = list(request.token_sha256)
        closed = self._auth.revoke(digests)
        log.info(
            "agent tokens revoked",
            extra={"agent_id": request.agent_id, "tokens": len(digests), "rpcs_closed": closed},
        )
        try:
            await self._revocations.add(digests)
        except Exception as exc:
            log.warning("recording a token revocation in Redis failed: %r", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the revocation could not be recorded for every kas")
        try:
            await self._events.publish(AgentTokenRevoked(agent_id=request.agent_id, token_sha256=digests))
        except Exception as exc:  # recorded: other kas find it on the list at their next re-validation
            log.warning("publishing a token revocation failed, kas instances will find it on the list: %r", exc)
        return rpc_pb2.RevokeAgentTokensResponse()


def subscribe_revocations(events: EventBus, auth: AgentAuthenticator) -> None:
    """Apply every ``AgentTokenRevoked`` event of the bus to ``auth``."""

    def apply(event: AgentTokenRevoked) -> None:
        cancelled = auth.revoke(event.token_sha256)
        log.info(
            "agent tokens revoked",
            extra={"agent_id": event.agent_id, "tokens": len(event.token_sha256), "rpcs_closed": cancelled},
        )

    events.on(AgentTokenRevoked, apply)


async def revalidate_once(auth: AgentAuthenticator, revocations: RevocationList) -> Collection[bytes]:
    """One round of :meth:`AgentAuthenticator.revalidate` against the list; the hub's refusals go on the list.

    A list that cannot be read (Redis down or stalled for :data:`LIST_READ_TIMEOUT_S`) is skipped this round;
    the hub is still asked about tokens whose cached answer expired. Returns the digests the hub refused.
    """
    revoked: set[bytes] = set()
    try:
        async with asyncio.timeout(LIST_READ_TIMEOUT_S):
            revoked = await revocations.read()
    except Exception as exc:
        log.warning("reading the token revocation list failed: %r", exc)
    refused = await auth.revalidate(revoked)
    if refused:
        try:
            async with asyncio.timeout(LIST_READ_TIMEOUT_S):
                await revocations.add(refused)
        except Exception as exc:
            log.warning("recording tokens the hub refused on the revocation list failed: %r", exc)
    return refused


async def revalidate_forever(auth: AgentAuthenticator, revocations: RevocationList, period_s: float) -> None:
    """Run :func:`revalidate_once` every ``period_s`` seconds (``agent.token_revalidation_period``) until cancelled."""
    while True:
        await asyncio.sleep(period_s)
        await revalidate_once(auth, revocations)


class TokenRevocationService:
    """kas' agent token revocation as a service with the modules' lifecycle (issue 24 item 3).

    Built before the listeners start: registers ``AgentTokens`` on the api listener and subscribes to
    ``AgentTokenRevoked``; :meth:`start` spawns the re-validation loop (``agent.token_revalidation_period``).

    Args:
        events: the event bus.
        auth: the agent authenticator whose cache and streams revocations act on.
        backend: where the revocation list lives.
        key_prefix: kascfg ``redis.key_prefix``.
        agent: the ``agent`` section (``info_cache_ttl``, ``token_revalidation_period``).
        api_server: the api gRPC listener.
        spawn: the supervisor's ``spawn``.
    """

    name = "agent_token_revocation"

    def __init__(
        self,
        events: EventBus,
        auth: AgentAuthenticator,
        backend: HashBackend,
        key_prefix: str,
        agent: AgentCF,
        api_server: grpc.aio.Server,
        spawn: Spawner,
    ) -> None:
        self._auth = auth
        self._period_s = agent.token_revalidation_period
        self._spawn = spawn
        self.revocations = RevocationList(
            backend, key_prefix, list_ttl_s(agent.info_cache_ttl, agent.token_revalidation_period)
        )
        subscribe_revocations(events, auth)
        rpc_pb2_grpc.add_AgentTokensServicer_to_server(AgentTokensServicer(events, auth, self.revocations), api_server)

    async def start(self) -> None:
        """Spawn the re-validation loop."""
        self._spawn("token_revalidation", self._revalidate)

    async def _revalidate(self) -> None:
        await revalidate_forever(self._auth, self.revocations, self._period_s)

    async def stop(self) -> None:
        """Nothing to undo: the loop is cancelled with the other supervised loops."""
