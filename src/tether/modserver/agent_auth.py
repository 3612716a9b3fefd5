"""Agent token authentication on the agent listener (kas.md §4.1).

agentk sends ``authorization: Bearer <agent token>`` on every RPC. kas asks the hub (``agent_info``)
who the token belongs to. Successful answers are cached in process memory for ``info_cache_ttl``;
refusals (HTTP 401/403/404) are cached in the shared store for ``info_cache_error_ttl`` under a key
derived from the first half of the token only, so a leaked key cannot reveal a usable token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import Protocol

import aiohttp
import grpc

from tether.modserver.gitlab_client import AgentInfo, GitlabClient, GitlabClientError
from tether.tool.grpc_meta import MetadataIn
from tether.tool.status import StatusError

log = logging.getLogger(__name__)
_CACHEABLE = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
}
_MESSAGES = {401: "unauthenticated", 403: "forbidden", 404: "agent not found"}


class ValueStore(Protocol):
    """A shared key-value store with per-key expiry (Redis ``SET PX`` / ``GET``, or memory)."""

    async def get_value(self, key: bytes) -> bytes | None:
        """Return the value, or None when absent or expired."""

    async def set_value(self, key: bytes, value: bytes, ttl_s: float) -> None:
        """Store ``value`` for ``ttl_s`` seconds."""


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


def token_key(prefix: str, token: str) -> bytes:
    """Cache key for ``token``: ``<prefix>:agent_info_errs:`` + SHA-256 of the token's first half (kas.md §3.4)."""
    return f"{prefix}:agent_info_errs:".encode() + hashlib.sha256(token[: len(token) // 2].encode()).digest()


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
        self._cache: dict[str, tuple[float, AgentInfo]] = {}
        self._inflight: dict[str, asyncio.Future[AgentInfo]] = {}

    async def authenticate(self, metadata: MetadataIn | None) -> AgentInfo:
        """Authenticate the RPC whose metadata is given.

        Raises:
            AuthError: UNAUTHENTICATED (no, malformed, unknown or revoked token), PERMISSION_DENIED,
                NOT_FOUND, or UNAVAILABLE when the hub cannot be reached.
        """
        token = bearer_token(metadata)
        cached = self._cache.get(token)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        # One hub call per token even when many RPCs of the same agent arrive together.
        lookup = self._inflight.get(token)
        if lookup is None:
            lookup = asyncio.ensure_future(self._lookup_and_cache(token))
            self._inflight[token] = lookup
            lookup.add_done_callback(lambda _: self._inflight.pop(token, None))
        return await asyncio.shield(lookup)

    async def _lookup_and_cache(self, token: str) -> AgentInfo:
        info = await self._lookup(token)
        if self._ttl_s > 0:
            self._cache[token] = (time.monotonic() + self._ttl_s, info)
        return info

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
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("agent_info unreachable: %r", exc)
            raise AuthError(
                grpc.StatusCode.UNAVAILABLE, "agent authentication is unavailable: hub unreachable"
            ) from exc

    async def _safe_get(self, key: bytes) -> bytes | None:
        assert self._errors is not None
        try:
            return await self._errors.get_value(key)
        except Exception:
            log.exception("reading the agent error cache failed")
            return None

    async def _safe_set(self, key: bytes, value: bytes) -> None:
        assert self._errors is not None
        try:
            await self._errors.set_value(key, value, self._error_ttl_s)
        except Exception:
            log.exception("writing the agent error cache failed")

    def forget(self, token: str) -> None:
        """Drop a cached success (used when a later call shows the token no longer works)."""
        self._cache.pop(token, None)
