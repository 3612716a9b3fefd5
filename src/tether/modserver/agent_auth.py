"""Agent token authentication on the agent listener (kas.md §4.1).

agentk sends ``authorization: Bearer <agent token>`` on every RPC. kas asks the hub (``agent_info``)
who the token belongs to. Successful answers are cached in process memory for ``info_cache_ttl`` (at most
:data:`MAX_CACHED_TOKENS`, least recently used first out); refusals (HTTP 401/403/404) are cached in the
shared store for ``info_cache_error_ttl``. Both are keyed on the SHA-256 of the whole token: a key
reveals no usable token, and two tokens sharing a first half never share an answer (issue 9 item 4;
upstream hashes the first half only).

Revocation (issue 9 item 7): the RPCs an agent opens with a token are held under its digest
(:meth:`AgentAuthenticator.hold`); :meth:`AgentAuthenticator.revoke` (fed by the ``AgentTokenRevoked`` event
every kas receives) forgets the token, refuses it for the cache lifetime, and cancels those RPCs, which
closes the token's tunnels and configuration streams at once instead of after the cache expires.

A kas can miss that event (frozen or cut from Redis while it was published), so what it trusts is re-validated
periodically (:meth:`AgentAuthenticator.revalidate`, issue 27 item 6): against the revocation list in Redis,
and, for a token that holds RPCs once its cached answer has expired, against the hub again.

The refusal cache is read on an RPC's path: a stalled Redis is given up within
:data:`~tether.tool.circuit_breaker.STALL_S` (issue 27 item 5) and the hub is asked instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, Protocol

import aiohttp
import grpc
from cachetools import TTLCache
from prometheus_client import Counter

from tether.modserver.gitlab_client import AgentInfo, GitlabClient, GitlabClientError, GitlabTimeout
from tether.tool.circuit_breaker import CircuitBreaker, CircuitOpen
from tether.tool.grpc_meta import MetadataIn
from tether.tool.grpc_reject import reject_handler
from tether.tool.logs import bind_for_task, connection_id_from
from tether.tool.rate_limit import RateLimiter
from tether.tool.rate_limit import per_minute as rate_per_minute
from tether.tool.status import StatusError

log = logging.getLogger(__name__)
_CACHEABLE = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
}
_MESSAGES = {401: "unauthenticated", 403: "forbidden", 404: "agent not found"}

#: Upstream kas' counter (``cmd/kas/kasapp/app_agent_server.go``; exposed as ``agent_server_rate_exceeded_total``).
RATE_EXCEEDED = Counter(
    "agent_server_rate_exceeded",
    "The total number of times configured rate limit of new agent connections was exceeded",
)


class ValueStore(Protocol):
    """A shared key-value store with per-key expiry (Redis ``SET PX`` / ``GET``, or memory)."""

    async def get_value(self, key: bytes) -> bytes | None:
        """Return the value, or None when absent or expired."""

    async def set_value(self, key: bytes, value: bytes, ttl_s: float) -> None:
        """Store ``value`` for ``ttl_s`` seconds."""

    async def ping(self) -> None:
        """Return when the store answers; raise when it does not."""


class AuthError(StatusError):
    """Authentication failed; ``code`` and ``message`` are the gRPC status to answer with."""


def bearer_token(metadata: MetadataIn | None) -> str:
    """Return the token of the single ``authorization: Bearer <token>`` entry.

    Raises:
        AuthError: UNAUTHENTICATED when absent, repeated or not a bearer token.
    """
    values = [v for k, v in metadata or () if k == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str) or not values[0].startswith("Bearer "):
        raise AuthError(
            grpc.StatusCode.UNAUTHENTICATED, "missing or malformed authorization metadata (want: Bearer <agent token>)"
        )
    token = values[0].removeprefix("Bearer ").strip()
    if not token:
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "empty agent token")
    return token


#: Most successful answers kept in memory; beyond, the least recently used are dropped.
MAX_CACHED_TOKENS = 10_000
#: Hub calls one re-validation round makes at once (tokens whose cached answer expired together).
REVALIDATION_CONCURRENCY = 10
#: Refusals that end a token's RPCs when the hub gives them on re-validation.
_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND})


def token_digest(token: str) -> bytes:
    """SHA-256 of the whole token (32 bytes): the only form kas keys or publishes a token by."""
    return hashlib.sha256(token.encode()).digest()


def token_key(prefix: str, token: str) -> bytes:
    """Refusal cache key for ``token``: ``<prefix>:agent_info_errs:`` + :func:`token_digest`."""
    return f"{prefix}:agent_info_errs:".encode() + token_digest(token)


class _Held:
    """The ``with`` block of :meth:`AgentAuthenticator.hold`.

    A class, not a generator context manager: one lives as long as each agent stream (three per agent), and a
    generator's frame cost kas about 1 KiB each at 10,000 agents (issue 9).
    """

    __slots__ = ("_auth", "_digest", "_task", "_tasks", "_token")

    def __init__(self, auth: AgentAuthenticator, token: str, digest: bytes, task: asyncio.Task[Any]) -> None:
        self._auth = auth
        self._token = token
        self._digest = digest
        self._task = task
        self._tasks: set[asyncio.Task[Any]] = set()

    def __enter__(self) -> None:
        self._tasks = self._auth._held.setdefault(self._digest, set())
        self._tasks.add(self._task)
        self._auth._tokens.setdefault(self._digest, self._token)  # to ask the hub again on re-validation

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        auth, digest, task = self._auth, self._digest, self._task
        self._tasks.discard(task)
        if not self._tasks and auth._held.get(digest) is self._tasks:
            del auth._held[digest]
            auth._tokens.pop(digest, None)
        # grpc.aio sends no status for a handler that ends cancelled, so the peer would hang until its deadline:
        # a cancellation caused by the revocation becomes UNAUTHENTICATED instead.
        cancelled = kind is not None and issubclass(kind, asyncio.CancelledError)
        if cancelled and digest in auth._revoked and task.cancelling():
            task.uncancel()
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, _MESSAGES[401]) from None


class AgentAuthenticator:
    """Resolves agent tokens to :class:`AgentInfo` through the hub, with caching.

    Args:
        client: the hub's internal API client.
        errors: shared store for cached refusals, or None.
        key_prefix: Redis key prefix (``redis.key_prefix``).
        ttl_s: lifetime of a cached success in seconds (``agent.info_cache_ttl``; 0 disables).
        error_ttl_s: lifetime of a cached refusal in seconds (``agent.info_cache_error_ttl``).
    """

    def __init__(
        self, client: GitlabClient, errors: ValueStore | None, key_prefix: str, ttl_s: float, error_ttl_s: float
    ) -> None:
        self._client = client
        self._errors = errors
        self._prefix = key_prefix
        self._ttl_s = ttl_s
        self._error_ttl_s = error_ttl_s
        self._cache: TTLCache[bytes, AgentInfo] | None = (
            TTLCache(MAX_CACHED_TOKENS, ttl_s, timer=time.monotonic) if ttl_s > 0 else None
        )
        self._inflight: dict[bytes, asyncio.Future[AgentInfo]] = {}
        # Recently revoked tokens stay refused for as long as an answer could have been cached anywhere.
        self._revoked: TTLCache[bytes, bool] = TTLCache(MAX_CACHED_TOKENS, max(ttl_s, error_ttl_s, 60.0))
        self._held: dict[bytes, set[asyncio.Task[Any]]] = {}
        #: The token of each digest in ``_held``, while it holds RPCs (the RPCs' metadata carries it anyway).
        self._tokens: dict[bytes, str] = {}
        self._errors_breaker = CircuitBreaker("agent_info_errors", errors.ping) if errors is not None else None

    async def authenticate(self, metadata: MetadataIn | None) -> AgentInfo:
        """Authenticate the RPC whose metadata is given.

        Raises:
            AuthError: UNAUTHENTICATED (no, malformed, unknown or revoked token), PERMISSION_DENIED,
                NOT_FOUND, or UNAVAILABLE when the hub cannot be reached.
        """
        token = bearer_token(metadata)
        return await self._authenticate(token, token_digest(token))

    async def _authenticate(self, token: str, digest: bytes) -> AgentInfo:
        if digest in self._revoked:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, _MESSAGES[401])
        cached = self._cache.get(digest) if self._cache is not None else None
        if cached is not None:
            return cached
        # One hub call per token even when many RPCs of the same agent arrive together.
        lookup = self._inflight.get(digest)
        if lookup is None:
            lookup = asyncio.ensure_future(self._lookup_and_cache(token, digest))
            self._inflight[digest] = lookup
            lookup.add_done_callback(lambda _: self._inflight.pop(digest, None))
        return await asyncio.shield(lookup)

    async def _lookup_and_cache(self, token: str, digest: bytes) -> AgentInfo:
        info = await self._lookup(token)
        if digest in self._revoked:  # revoked while the hub was answering
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, _MESSAGES[401])
        if self._cache is not None:
            self._cache[digest] = info
        return info

    def hold(self, metadata: MetadataIn | None) -> _Held:
        """Register the running RPC (the current task) as opened with the metadata's token, for a ``with`` block.

        Revoking the token ends the RPC with UNAUTHENTICATED (its task is cancelled, then answers). Use after
        :meth:`authenticate` succeeded, around the RPC's life.

        Raises:
            AuthError: UNAUTHENTICATED when the token was revoked meanwhile, or the metadata has no token.
        """
        token = bearer_token(metadata)
        digest = token_digest(token)
        if digest in self._revoked:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, _MESSAGES[401])
        task = asyncio.current_task()
        assert task is not None
        return _Held(self, token, digest, task)

    def revoke(self, digests: Iterable[bytes]) -> int:
        """Forget and refuse the tokens with these SHA-256 digests; cancel the RPCs opened with them.

        Returns:
            How many RPCs were cancelled.
        """
        cancelled = 0
        for digest in digests:
            self._revoked[digest] = True
            if self._cache is not None:
                self._cache.pop(digest, None)
            self._tokens.pop(digest, None)
            for task in self._held.pop(digest, set()):
                task.cancel()
                cancelled += 1
        return cancelled

    async def revalidate(self, revoked: Collection[bytes]) -> list[bytes]:
        """Re-check the tokens this kas trusts; call every ``agent.token_revalidation_period`` (issue 27 item 6).

        1. Every digest of ``revoked`` (the revocation list in Redis) that is cached here or holds RPCs is
           revoked (:meth:`revoke`): this is how a kas that missed the ``AgentTokenRevoked`` event catches up.
        2. Every token that holds RPCs (tunnels, configuration streams) but whose cached answer has expired is
           asked to the hub again, :data:`REVALIDATION_CONCURRENCY` at a time; one the hub refuses (401, 403,
           404) is revoked, so a tunnel never outlives ``info_cache_ttl`` plus one period even when no kas
           heard of the revocation. A hub that cannot be reached ends nothing.

        Args:
            revoked: SHA-256 digests (32 bytes) of revoked tokens.

        Returns:
            The digests the hub refused in step 2 (for the caller to add to the revocation list).
        """
        known = [d for d in revoked if d in self._held or (self._cache is not None and d in self._cache)]
        if known:
            closed = self.revoke(known)
            log.info("agent tokens found on the revocation list", extra={"tokens": len(known), "rpcs_closed": closed})
        stale = [(d, t) for d, t in self._tokens.items() if self._cache is None or d not in self._cache]
        if not stale:
            return []
        slots = asyncio.Semaphore(REVALIDATION_CONCURRENCY)

        async def refused(digest: bytes, token: str) -> bool:
            async with slots:
                try:
                    await self._authenticate(token, digest)
                except AuthError as exc:
                    return exc.code in _REFUSED
                return False

        # One token's unexpected error must not cost the others their verdict in this round.
        outcomes = await asyncio.gather(*(refused(d, t) for d, t in stale), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                log.warning("agent token re-validation failed: %r", outcome)
        gone = [digest for (digest, _), no in zip(stale, outcomes, strict=True) if no is True]
        if gone:
            closed = self.revoke(gone)
            log.info(
                "agent tokens refused by the hub on re-validation", extra={"tokens": len(gone), "rpcs_closed": closed}
            )
        return gone

    async def _lookup(self, token: str) -> AgentInfo:
        key = token_key(self._prefix, token)
        if self._errors is not None:
            cached_error = await self._safe_get(key)
            if cached_error is not None:
                status = int(json.loads(cached_error)["status_code"])
                raise AuthError(_CACHEABLE[status], _MESSAGES[status])
        try:
            return await self._client.get_agent_info(token)
        except GitlabClientError as exc:
            if exc.status_code in _CACHEABLE:
                if self._errors is not None and self._error_ttl_s > 0:
                    payload = json.dumps({"status_code": exc.status_code, "path": exc.path, "reason": exc.reason})
                    await self._safe_set(key, payload.encode())
                raise AuthError(_CACHEABLE[exc.status_code], _MESSAGES[exc.status_code]) from exc
            log.warning("agent_info failed: %s", exc)
            raise AuthError(grpc.StatusCode.UNAVAILABLE, f"agent authentication is unavailable: {exc}") from exc
        except GitlabTimeout as exc:
            log.warning("agent_info: %s", exc)
            raise AuthError(grpc.StatusCode.UNAVAILABLE, f"agent authentication is unavailable: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("agent_info unreachable: %r", exc)
            raise AuthError(
                grpc.StatusCode.UNAVAILABLE, "agent authentication is unavailable: hub unreachable"
            ) from exc

    async def _safe_get(self, key: bytes) -> bytes | None:
        errors, breaker = self._errors, self._errors_breaker
        assert errors is not None and breaker is not None
        try:
            return await breaker.call(lambda: errors.get_value(key))
        except CircuitOpen:
            return None
        except Exception:
            log.exception("reading the agent error cache failed")
            return None

    async def _safe_set(self, key: bytes, value: bytes) -> None:
        errors, breaker = self._errors, self._errors_breaker
        assert errors is not None and breaker is not None
        try:
            await breaker.call(lambda: errors.set_value(key, value, self._error_ttl_s))
        except CircuitOpen:
            return
        except Exception:
            log.exception("writing the agent error cache failed")

    async def prime(self) -> None:
        """Ask the refusal cache once at start (:meth:`~tether.tool.circuit_breaker.CircuitBreaker.prime`)."""
        if self._errors_breaker is not None:
            await self._errors_breaker.prime()

    async def close(self) -> None:
        """Stop probing a stalled refusal cache."""
        if self._errors_breaker is not None:
            await self._errors_breaker.close()

    def forget(self, token: str) -> None:
        """Drop a cached success (used when a later call shows the token no longer works)."""
        if self._cache is not None:
            self._cache.pop(token_digest(token), None)


class AgentAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rate-limits and authenticates every RPC on the agent listener before its request is decoded.

    Without it, a handler's request message (up to ``max_message_size``) is parsed before the handler checks
    the token (issue 9 item 7). Handlers still call :meth:`AgentAuthenticator.authenticate` for the
    :class:`AgentInfo`; the answer then comes from the cache. The handler's log lines carry the ``agent_id``
    and the ``connection_id`` agentk sent (:func:`tether.tool.logs.connection_id_from`).

    New RPCs per token are limited to ``connections_per_token_per_minute`` across every kas sharing the
    limiter's Redis (upstream's ``agent.listen.connections_per_token_per_minute``; 0 turns it off), in this
    kas' memory while Redis fails or stalls (issue 27 item 5); beyond, RPCs get ``RESOURCE_EXHAUSTED`` before any
    hub call. The key is the token's SHA-256.

    Args:
        auth: the authenticator.
        limiter: the shared rate limiter, or None for no limit.
        per_minute: the limit.
    """

    def __init__(self, auth: AgentAuthenticator, limiter: RateLimiter | None = None, per_minute: int = 0) -> None:
        self._auth = auth
        self._limiter = limiter if per_minute > 0 else None
        self._limit = rate_per_minute(max(per_minute, 1))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Refuse the call with the authentication error, or hand it to its handler."""
        metadata = handler_call_details.invocation_metadata
        try:
            if self._limiter is not None:
                key = token_digest(bearer_token(metadata)).hex()
                if not await self._limiter.hit("agent_rpc", self._limit, key):
                    RATE_EXCEEDED.inc()
                    return reject_handler(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"rate limit exceeded: more than {self._limit.amount} RPCs per minute with this agent token "
                        "(agent.listen.connections_per_token_per_minute)",
                    )
            agent = await self._auth.authenticate(metadata)
        except AuthError as exc:
            return reject_handler(exc.code, exc.message)
        # The handler runs in this task: its lines carry the agent and agentk's connection (issue 9 item 6).
        bind_for_task(agent_id=agent.agent_id, connection_id=connection_id_from(metadata))
        return await continuation(handler_call_details)
