"""The hub's answer to "does this caller own this workspace?", cached briefly and dropped when the workspace changes.

One hub call per (workspace name, zone, credentials) per ``authorization_cache_ttl``; refusals are kept for
``authorization_cache_error_ttl``. Concurrent requests with the same key share one call. When the hub announces
that a workspace changed (its state, through ``WorkspacesInvalidated`` on the event bus), every answer about it
is dropped at once, and an answer still in flight from before the change is not kept. Both caches are bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
from cachetools import TTLCache

from tether.modserver.gitlab_client import GitlabClient, GitlabClientError, GitlabTimeout, WorkspaceAuthorization
from tether.modules.workspace_access.server.credentials import Credentials

__all__ = ["AccessRefused", "WorkspaceAuthorizer"]

log = logging.getLogger(__name__)

#: Most cached answers of each kind (successes, refusals).
_CACHE_SIZE = 10_000
#: Most workspace names whose change counter is remembered (older ones restart at 0, which only costs a refill).
_GENERATIONS = 100_000

_Key = tuple[str, str, bytes]


class AccessRefused(Exception):
    """The hub refused, or could not be asked.

    Args:
        code: 401 (credentials unknown, expired, signed out, or without the scope), 403 (not the owner, or no such
            workspace: the two look the same), 502 (the hub failed or is unreachable).
        message: for the client.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_Outcome = WorkspaceAuthorization | AccessRefused


class WorkspaceAuthorizer:
    """Asks the hub's ``authorize_workspace_user``, caching in process memory.

    Args:
        client: the hub's internal API client.
        ttl_s: seconds a success is reused (0 disables).
        error_ttl_s: seconds a refusal is reused (0 disables).
        clock: monotonic clock in seconds (tests replace it).
    """

    def __init__(
        self, client: GitlabClient, ttl_s: float, error_ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._answers: TTLCache[_Key, WorkspaceAuthorization] | None = (
            TTLCache(_CACHE_SIZE, ttl_s, timer=clock) if ttl_s > 0 else None
        )
        self._refusals: TTLCache[_Key, AccessRefused] | None = (
            TTLCache(_CACHE_SIZE, error_ttl_s, timer=clock) if error_ttl_s > 0 else None
        )
        self._inflight: dict[_Key, asyncio.Future[_Outcome]] = {}
        self._generations: TTLCache[str, int] = TTLCache(_GENERATIONS, max(ttl_s, error_ttl_s, 1.0) * 10, timer=clock)

    async def authorize(self, name: str, zone: str | None, credentials: Credentials) -> WorkspaceAuthorization:
        """The hub's answer for ``credentials`` and workspace ``name`` (in ``zone`` for a host-form address).

        Raises:
            AccessRefused: see the class.
        """
        digest = hashlib.sha256(f"{credentials.access_type}\0{credentials.access_key}".encode()).digest()
        key: _Key = (name, zone or "", digest)
        outcome: _Outcome | None = self._answers.get(key) if self._answers is not None else None
        if outcome is None and self._refusals is not None:
            outcome = self._refusals.get(key)
        if outcome is None:
            lookup = self._inflight.get(key)
            if lookup is None:
                lookup = self._start(key, zone, credentials)
            outcome = await asyncio.shield(lookup)
        if isinstance(outcome, AccessRefused):
            raise AccessRefused(outcome.code, outcome.message)  # fresh: a shared one would collect tracebacks
        return outcome

    def invalidate(self, names: Iterable[str]) -> int:
        """Drop every answer about workspaces ``names``; returns how many were dropped."""
        wanted = set(names)
        if not wanted:
            return 0
        for name in wanted:
            self._generations[name] = self._generations.get(name, 0) + 1
        dropped = 0
        for cache in (self._answers, self._refusals):
            if cache is None:
                continue
            for key in [k for k in list(cache.keys()) if k[0] in wanted]:
                cache.pop(key, None)
                dropped += 1
        # A lookup in flight answers with what the hub knew before: the next request asks again.
        for key in [k for k in self._inflight if k[0] in wanted]:
            self._inflight.pop(key, None)
        return dropped

    def _start(self, key: _Key, zone: str | None, credentials: Credentials) -> asyncio.Future[_Outcome]:
        generation = self._generations.get(key[0], 0)  # taken now: a change before the call starts counts
        lookup = asyncio.ensure_future(self._lookup(key, zone, credentials, generation))
        self._inflight[key] = lookup

        def forget(done: asyncio.Future[_Outcome]) -> None:
            if self._inflight.get(key) is done:  # an invalidation may have replaced it already
                del self._inflight[key]

        lookup.add_done_callback(forget)
        return lookup

    async def _lookup(self, key: _Key, zone: str | None, credentials: Credentials, generation: int) -> _Outcome:
        name = key[0]
        outcome = await self._ask(name, zone, credentials)
        if self._generations.get(name, 0) != generation:
            return outcome  # the workspace changed meanwhile: answer this request, remember nothing
        if isinstance(outcome, WorkspaceAuthorization):
            if self._answers is not None:
                self._answers[key] = outcome
        elif outcome.code in (401, 403) and self._refusals is not None:
            self._refusals[key] = outcome
        return outcome

    async def _ask(self, name: str, zone: str | None, credentials: Credentials) -> _Outcome:
        try:
            answer = await self._client.authorize_workspace_user(
                name, zone, credentials.access_type, credentials.access_key
            )
        except GitlabClientError as exc:
            if exc.status_code == 401:
                return AccessRefused(
                    401,
                    "the credentials are not valid (unknown, expired or revoked token, a token "
                    "without scope api or read_api, or a session that was signed out)",
                )
            if exc.status_code in (403, 404):
                return AccessRefused(403, f"you do not own a workspace named {name!r} at this address")
            log.warning("authorize_workspace_user failed: %s", exc)
            return AccessRefused(502, f"authorizing the request failed: the hub answered HTTP {exc.status_code}")
        except GitlabTimeout as exc:
            log.warning("authorize_workspace_user: %s", exc)
            return AccessRefused(502, f"authorizing the request failed: {exc}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("authorize_workspace_user unreachable: %r", exc)
            return AccessRefused(502, "authorizing the request failed: the hub is unreachable")
        if answer.name != name:
            return AccessRefused(502, f"authorizing the request failed: the hub answered for workspace {answer.name!r}")
        return answer
