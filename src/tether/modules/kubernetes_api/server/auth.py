"""Who is calling the Kubernetes API proxy, and as whom the request reaches the cluster (kas.md §4.5).

Exactly one credential source per request:

- ``Authorization: Bearer pat:<agent id>:<personal access token>`` (one header only);
- otherwise the browser form: cookie ``_gitlab_kas`` (URL-escaped session id), the agent id in header
  ``Gitlab-Agent-Id`` or query ``gitlab-agent-id`` (exactly one value in all), and the CSRF token in header
  ``X-Csrf-Token`` or query ``gitlab-csrf-token`` (exactly one value in all).

Both are checked with the hub's ``authorize_proxy_user``. Any missing, malformed or refused credential is
HTTP 401 with ``Gitlab-Unauthorized: true``; the hub's 401, 403 and 404 look the same to the client so that
agent ids cannot be enumerated. Answers are cached per credentials: successes for
``allowed_agent_cache_ttl``, refusals for ``allowed_agent_cache_error_ttl``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import aiohttp
from cachetools import TTLCache
from multidict import MultiMapping

from tether.modserver.gitlab_client import GitlabClient, GitlabClientError, GitlabTimeout, ProxyUserAuthorization
from tether.modules.kubernetes_api.server.status import UNAUTHORIZED_HEADER, ProxyError
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2
from tether.tool.ids import parse_id

__all__ = [
    "AGENT_ID_HEADER",
    "AGENT_ID_QUERY",
    "COOKIE_NAME",
    "CSRF_HEADER",
    "CSRF_QUERY",
    "PAT_ACCESS",
    "SESSION_ACCESS",
    "ProxyCredentials",
    "ProxyUserAuthorizer",
    "credentials_from",
    "impersonation_for",
]

log = logging.getLogger(__name__)

PAT_ACCESS = "personal_access_token"
SESSION_ACCESS = "session_cookie"
COOKIE_NAME = "_gitlab_kas"
AGENT_ID_HEADER = "Gitlab-Agent-Id"
AGENT_ID_QUERY = "gitlab-agent-id"
CSRF_HEADER = "X-Csrf-Token"
CSRF_QUERY = "gitlab-csrf-token"
_UNAUTHORIZED = {UNAUTHORIZED_HEADER: "true"}
_PAT_FORM = "'Authorization: Bearer pat:<agent id>:<personal access token>'"
#: Most cached answers of each kind (successes, refusals).
_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class ProxyCredentials:
    """The credentials of one request.

    Attributes:
        agent_id: the agent the request is for.
        access_type: :data:`PAT_ACCESS` or :data:`SESSION_ACCESS`.
        access_key: the token, or the unescaped session cookie value.
        csrf_token: the CSRF token of a session request; empty for a token.
    """

    agent_id: int
    access_type: str
    access_key: str
    csrf_token: str = ""


def _unauthorized(message: str) -> ProxyError:
    return ProxyError(401, f"Unauthorized: {message}", _UNAUTHORIZED)


def _agent_id(text: str, where: str) -> int:
    agent_id = parse_id(text)
    if agent_id is None:
        raise _unauthorized(f"{where}: agent id {text[:40]!r} is not a positive decimal number below 2**63")
    return agent_id


def _from_authorization(values: list[str]) -> ProxyCredentials:
    if len(values) != 1:
        raise _unauthorized(f"exactly one Authorization header is allowed, got {len(values)}")
    value = values[0]
    if not value.startswith("Bearer "):
        raise _unauthorized(f"Authorization header must be of the form {_PAT_FORM}")
    kind, _, rest = value.removeprefix("Bearer ").strip().partition(":")
    if kind == "ci":
        raise _unauthorized(f"CI job tokens (ci:...) are not supported by this kas; use {_PAT_FORM}")
    if kind != "pat":
        raise _unauthorized(f"unknown token type {kind[:20]!r} in the Authorization header; use {_PAT_FORM}")
    agent_text, _, token = rest.partition(":")
    agent_id = _agent_id(agent_text, "Authorization header")
    if not token:
        raise _unauthorized(f"empty token in the Authorization header; use {_PAT_FORM}")
    return ProxyCredentials(agent_id, PAT_ACCESS, token)


def _one(headers: MultiMapping[str], header: str, query: MultiMapping[str], param: str, what: str) -> str:
    values = [*headers.getall(header, []), *query.getall(param, [])]
    if len(values) != 1:
        raise _unauthorized(
            f"exactly one {what} must be given, in the {header!r} header or the {param!r} query parameter; "
            f"got {len(values)}"
        )
    return values[0]


def credentials_from(
    headers: MultiMapping[str], query: MultiMapping[str], cookies: Mapping[str, str]
) -> ProxyCredentials:
    """Read the request's credentials (module docstring).

    Args:
        headers: the request headers (case-insensitive multi-mapping).
        query: the decoded query parameters.
        cookies: the request cookies, name -> raw value.

    Raises:
        ProxyError: 401 with ``Gitlab-Unauthorized: true`` when credentials are missing or malformed.
    """
    authorization = headers.getall("Authorization", [])
    if authorization:
        return _from_authorization(list(authorization))
    cookie = cookies.get(COOKIE_NAME)
    if cookie is None:
        raise _unauthorized(f"no credentials: send {_PAT_FORM}, or a {COOKIE_NAME} session cookie")
    session = unquote(cookie)
    if not session:
        raise _unauthorized(f"empty {COOKIE_NAME} session cookie")
    agent_id = _agent_id(_one(headers, AGENT_ID_HEADER, query, AGENT_ID_QUERY, "agent id"), "agent id")
    csrf = _one(headers, CSRF_HEADER, query, CSRF_QUERY, "CSRF token")
    return ProxyCredentials(agent_id, SESSION_ACCESS, session, csrf)


def impersonation_for(auth: ProxyUserAuthorization, access_type: str) -> rpc_pb2.ImpersonationConfig | None:
    """The identity to impose for an authorized user, or None for ``access_as: agent`` (kas.md §4.5).

    For ``access_as: user``: user ``gitlab:user:<username>``; groups ``gitlab:user``, then
    ``gitlab:project_role:<project id>:<role>`` and ``gitlab:group_role:<group id>:<role>`` for each role;
    extra ``agent.gitlab.com/id``, ``agent.gitlab.com/username``, ``agent.gitlab.com/access_type`` and
    ``agent.gitlab.com/config_project_id``, one value each.

    Args:
        auth: the hub's ``authorize_proxy_user`` answer.
        access_type: :data:`PAT_ACCESS` or :data:`SESSION_ACCESS`.
    """
    if not auth.access_as_user:
        return None
    groups = ["gitlab:user"]
    groups += [f"gitlab:project_role:{p.id}:{role}" for p in auth.projects for role in p.roles]
    groups += [f"gitlab:group_role:{g.id}:{role}" for g in auth.groups for role in g.roles]
    extra = {
        "agent.gitlab.com/id": str(auth.agent_id),
        "agent.gitlab.com/username": auth.username,
        "agent.gitlab.com/access_type": access_type,
        "agent.gitlab.com/config_project_id": str(auth.config_project_id),
    }
    return rpc_pb2.ImpersonationConfig(
        username=f"gitlab:user:{auth.username}",
        groups=groups,
        extra=[rpc_pb2.ExtraKeyVal(key=key, val=[value]) for key, value in extra.items()],
    )


_Outcome = ProxyUserAuthorization | ProxyError


def _key(credentials: ProxyCredentials) -> bytes:
    """The cache key of ``credentials``: a digest, so the cache holds no token."""
    fields = (str(credentials.agent_id), credentials.access_type, credentials.access_key, credentials.csrf_token)
    return hashlib.sha256("\0".join(fields).encode()).digest()


class ProxyUserAuthorizer:
    """Checks credentials with the hub's ``authorize_proxy_user``, caching answers in process memory.

    Concurrent requests with the same credentials share one hub call.

    Args:
        client: the hub's internal API client.
        ttl_s: seconds a success is reused (``allowed_agent_cache_ttl``; 0 disables).
        error_ttl_s: seconds a refusal is reused (``allowed_agent_cache_error_ttl``; 0 disables).
        clock: monotonic clock in seconds (tests replace it).
    """

    def __init__(
        self,
        client: GitlabClient,
        ttl_s: float,
        error_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._clock = clock
        # Bounded: at most _CACHE_SIZE answers of each kind, least recently used out first (issue 9 item 4).
        self._cache: TTLCache[bytes, ProxyUserAuthorization] | None = (
            TTLCache(_CACHE_SIZE, ttl_s, timer=clock) if ttl_s > 0 else None
        )
        self._refusals: TTLCache[bytes, ProxyError] | None = (
            TTLCache(_CACHE_SIZE, error_ttl_s, timer=clock) if error_ttl_s > 0 else None
        )
        self._inflight: dict[bytes, asyncio.Future[_Outcome]] = {}

    def granted(self, credentials: ProxyCredentials) -> ProxyUserAuthorization | None:
        """The hub's cached success for exactly these ``credentials``, or None (never asked, refused or expired).

        Costs no I/O: the proxy uses it to skip its failed-credentials throttle for credentials the hub has
        already accepted, which cannot be guesses (issue 28 item 2).
        """
        return self._cache.get(_key(credentials)) if self._cache is not None else None

    async def authorize(self, credentials: ProxyCredentials) -> ProxyUserAuthorization:
        """Return the hub's answer for ``credentials``.

        Raises:
            ProxyError: 401 (hub answered 401, 403 or 404: unknown credentials, or no access to the agent),
                500 (any other hub failure, or the hub is unreachable).
        """
        key = _key(credentials)
        outcome: _Outcome | None = self._cache.get(key) if self._cache is not None else None
        if outcome is None and self._refusals is not None:
            outcome = self._refusals.get(key)
        if outcome is None:
            lookup = self._inflight.get(key)
            if lookup is None:
                lookup = asyncio.ensure_future(self._lookup(key, credentials))
                self._inflight[key] = lookup
                lookup.add_done_callback(lambda _: self._inflight.pop(key, None))
            outcome = await asyncio.shield(lookup)
        if isinstance(outcome, ProxyError):
            # A fresh exception each time: a cached one would collect every request's traceback.
            raise ProxyError(outcome.code, outcome.message, outcome.headers)
        return outcome

    async def _lookup(self, key: bytes, credentials: ProxyCredentials) -> _Outcome:
        try:
            auth = await self._client.authorize_proxy_user(
                credentials.agent_id, credentials.access_type, credentials.access_key, credentials.csrf_token
            )
        except GitlabClientError as exc:
            if exc.status_code not in (401, 403, 404):
                log.warning("authorize_proxy_user failed: %s", exc)
                return ProxyError(500, f"authorizing the user failed: hub answered HTTP {exc.status_code}")
            refusal = _unauthorized(
                f"the credentials are not valid, or do not give access to agent {credentials.agent_id}"
            )
            if self._refusals is not None:
                self._refusals[key] = refusal
            return refusal
        except GitlabTimeout as exc:
            log.warning("authorize_proxy_user: %s", exc)
            return ProxyError(500, f"authorizing the user failed: {exc}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("authorize_proxy_user unreachable: %r", exc)
            return ProxyError(500, "authorizing the user failed: the hub is unreachable")
        if auth.agent_id != credentials.agent_id:
            return ProxyError(500, f"authorizing the user failed: the hub answered for agent {auth.agent_id}")
        if self._cache is not None:
            self._cache[key] = auth
        return auth
