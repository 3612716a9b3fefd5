"""kas' client for the control plane's internal API (the hub; "GitLab Rails" in the seeds).

Every call carries a ``Gitlab-Kas-Api-Request`` JWT (``iss=gitlab-kas``, ``aud=gitlab``, 30 s; kas.md §4.4).
Calls made on behalf of an agent also carry its token, as ``Authorization: Bearer`` (upstream) and as
``Gitlab-Agent-Api-Request`` (Tether's hub accepts either).

Every call is bounded by one deadline, ``gitlab.request_timeout`` (default :data:`DEFAULT_REQUEST_TIMEOUT_S`,
upstream's response-header timeout), covering connecting, sending, waiting for the answer and reading its body;
a hub that accepts the connection and never answers frees the caller at the deadline with
:class:`GitlabTimeout` (issue 9 item 5). Upstream bounds dialling (30 s) and the response headers (20 s) but
not the body; here one stalled peer cannot hold an agent's RPC or a proxied request longer than the deadline.

At most :data:`MAX_CONNECTIONS` calls are on the wire at once (upstream keeps 100 idle connections); the others
wait for a slot, in order, and the call's own deadline starts once it has one. A waiting call gives up when the
hub has answered nothing (no answer of any status) for :data:`QUEUE_TIMEOUT_FACTOR` deadlines, and in any case
after :data:`QUEUE_MAX_FACTOR` deadlines. So a storm of agents connecting together (10,000 ``agent_info`` calls)
queues in kas for as long as a busy hub keeps answering, instead of failing calls after a fixed wait: each such
failure ended an agent's stream, which agentk re-opened a second later at the back of the same queue, and the
repeated work lengthened the storm (issue 28 item 5). A stalled hub still fails every caller in bounded time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from tether import __version__
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, SecondSigner
from tether.tool.logs import REQUEST_ID_HEADER, current_request_id

T = TypeVar("T")
JWT_HEADER = "Gitlab-Kas-Api-Request"
AGENT_TOKEN_HEADER = "Gitlab-Agent-Api-Request"
_JWT_LIFETIME_S = 30.0
#: Seconds one internal API call may take from connecting to the last byte of the answer.
DEFAULT_REQUEST_TIMEOUT_S = 20.0
#: Seconds to open the TCP (and TLS) connection, within the call's deadline.
CONNECT_TIMEOUT_S = 5.0
#: Calls on the wire to the hub at once.
MAX_CONNECTIONS = 100
#: A call waiting for a free connection gives up once the hub has answered nothing for this many deadlines.
QUEUE_TIMEOUT_FACTOR = 3
#: A call waits for a free connection at most this many times its deadline, however busy the hub answers.
QUEUE_MAX_FACTOR = 15


class GitlabTimeout(TimeoutError):
    """The hub did not complete a call within the deadline; the message names the call and the setting.

    Attributes:
        path: the internal API path called.
        timeout_s: the deadline that passed, in seconds.
    """

    def __init__(self, method: str, path: str, timeout_s: float, *, phase: str = "answer", in_flight: int = 0) -> None:
        if phase == "queue":
            text = (
                f"no connection to the hub came free for {method} {path} within {timeout_s:g} s: {in_flight} "
                "calls were in flight (the hub is slow or stalled; gitlab.request_timeout)"
            )
        else:
            what = "accept a connection for" if phase == "connect" else "answer"
            text = f"the hub did not {what} {method} {path} within {timeout_s:g} s (gitlab.request_timeout)"
        super().__init__(text)
        self.path = path
        self.timeout_s = timeout_s


class GitlabClientError(Exception):
    """A non-2xx answer from the internal API (upstream ``ClientError{status_code, path, reason}``)."""

    def __init__(self, status_code: int, path: str, reason: str) -> None:
        super().__init__(f"{path}: HTTP {status_code}: {reason}")
        self.status_code = status_code
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class ModuleResponse:
    """The hub's answer to a module request: status, reason phrase, headers (name -> values) and body."""

    status: int
    reason: str
    headers: dict[str, list[str]]
    body: bytes


@dataclass(frozen=True, slots=True)  # one per cached agent token
class AgentInfo:
    """What the hub says about an agent token (kas.md §4.1 ``GetAgentInfoResponse``).

    Attributes:
        agent_id: id of the agent (> 0).
        project_id: id of the agent's configuration project (> 0).
        agent_name: the agent's name (a DNS label).
        default_branch: configuration project default branch (informational).
    """

    agent_id: int
    project_id: int
    agent_name: str
    default_branch: str = ""


@dataclass(frozen=True)
class AgentConfigurationDoc:
    """The agent's configuration as the hub keeps it.

    Attributes:
        commit_id: version identifier; changes whenever the configuration changes.
        configuration: the ``ConfigurationFile`` as JSON-compatible data (protobuf JSON field names).
        project_path: full path of the agent's project.
    """

    commit_id: str
    configuration: dict[str, Any]
    project_path: str = ""


@dataclass(frozen=True)
class RoleGrant:
    """A project or group the user belongs to, with the user's roles in it.

    Attributes:
        id: project or group id.
        roles: role names, e.g. ``("developer",)``.
    """

    id: int
    roles: tuple[str, ...]


@dataclass(frozen=True)
class ProxyUserAuthorization:
    """The hub's answer to ``authorize_proxy_user`` (kas.md §4.5 ``AuthorizeProxyUserResponse``).

    Attributes:
        agent_id: the agent the user may reach.
        config_project_id: the agent's configuration project.
        user_id: the GitLab user's id.
        username: the GitLab user's username.
        access_as_user: True for ``access_as: {user: ...}`` (impersonate the user), False for
            ``access_as: {agent: {}}`` (the agent's own identity).
        projects: with ``access_as_user``, the projects and the user's roles in each.
        groups: with ``access_as_user``, the groups and the user's roles in each.
        record_sessions: the agent's configuration has ``audit: {record_sessions: true}`` (Tether addition,
            issue 25 item 2): kas records the exec/attach sessions it relays to this agent.
        credential_id: the hub's id of the token or session the user presented (Tether addition,
            ``audit.credential_id``, issue 25 item 1); 0 when the hub did not say (upstream GitLab).
    """

    agent_id: int
    config_project_id: int
    user_id: int
    username: str
    access_as_user: bool
    projects: tuple[RoleGrant, ...] = ()
    groups: tuple[RoleGrant, ...] = ()
    record_sessions: bool = False
    credential_id: int = 0


@dataclass(frozen=True)
class WorkspaceAuthorization:
    """The hub's answer to ``authorize_workspace_user``: the caller owns this workspace (issue 13).

    Attributes:
        workspace_id: the workspace's id.
        name: its name, which is also its Service's name.
        namespace: its namespace.
        agent_id: the agent whose cluster runs it.
        project_id: its project.
        ports: the Service ports it exposes (its devfile's endpoints), ascending.
        actual_state: e.g. ``Running``, ``Stopped`` (seed 003 states).
        desired_state: e.g. ``Running``.
        message: why it is ``Failed`` or ``Error``; empty otherwise.
        user_id: the caller, its owner.
        username: the caller's username.
        credential_id: the hub's id of the token or session the caller used (``audit.credential_id``), or 0.
    """

    workspace_id: int
    name: str
    namespace: str
    agent_id: int
    project_id: int
    ports: tuple[int, ...]
    actual_state: str
    desired_state: str
    message: str
    user_id: int
    username: str
    credential_id: int = 0


class GitlabClient:
    """HTTP client for ``<address>/api/v4/internal/kubernetes/...``.

    Args:
        address: base URL of the hub, e.g. ``http://127.0.0.1:8080``.
        secret: the shared JWT secret (32 bytes).
        timeout_s: deadline of each call in seconds, from connecting to the end of the answer (> 0); waiting
            for one of the ``max_connections`` connections comes before it: it ends once the hub has answered
            nothing for :data:`QUEUE_TIMEOUT_FACTOR` times as much, or after :data:`QUEUE_MAX_FACTOR` times.
        max_connections: calls on the wire at once.

    Every method raises :class:`GitlabTimeout` (a ``TimeoutError``) when its call misses either bound.
    """

    def __init__(
        self,
        address: str,
        secret: bytes,
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self._base = address.rstrip("/")
        self._timeout_s = timeout_s
        self._connect_timeout_s = min(CONNECT_TIMEOUT_S, timeout_s)
        # No aiohttp total: asyncio.timeout in _deadline is the one bound, and also covers reading the body.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        #: Loop time of the hub's last answer (any status): waiting calls stay queued while it keeps answering.
        self._answered_at = 0.0
        # 10,000 agents connecting ask the hub 20,000 times: one signature a second, not one per call.
        self._jwt = SecondSigner(secret, ISSUER_KAS, AUDIENCE_GITLAB, _JWT_LIFETIME_S)

    async def _acquire(self, method: str, path: str) -> None:
        # A timer, not asyncio.timeout: it is moved on while the hub keeps answering, and the call keeps its place
        # in the semaphore's queue (a timeout cancelled and re-entered would put it at the back).
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stall_s = self._timeout_s * QUEUE_TIMEOUT_FACTOR
        began = loop.time()
        give_up_at = began + self._timeout_s * QUEUE_MAX_FACTOR
        expired = 0.0  # the bound that passed, in seconds
        timer: asyncio.TimerHandle

        def check() -> None:
            nonlocal timer, expired
            when = min(max(began, self._answered_at) + stall_s, give_up_at)
            if loop.time() >= when:
                expired = stall_s if when < give_up_at else give_up_at - began
                task.cancel()
            else:
                timer = loop.call_at(when, check)

        cancelling = task.cancelling()
        timer = loop.call_at(began + stall_s, check)
        try:
            await self._slots.acquire()
        except asyncio.CancelledError as exc:
            if expired and task.uncancel() <= cancelling:
                raise GitlabTimeout(method, path, expired, phase="queue", in_flight=self._max_connections) from exc
            raise
        finally:
            timer.cancel()

    @asynccontextmanager
    async def _deadline(self, method: str, path: str) -> AsyncIterator[None]:
        await self._acquire(method, path)
        try:
            async with asyncio.timeout(self._timeout_s):
                yield
            self._answered_at = asyncio.get_running_loop().time()
        except GitlabClientError:
            self._answered_at = asyncio.get_running_loop().time()  # an error status is an answer too
            raise
        except aiohttp.ConnectionTimeoutError as exc:
            raise GitlabTimeout(method, path, self._connect_timeout_s, phase="connect") from exc
        except TimeoutError as exc:
            raise GitlabTimeout(method, path, self._timeout_s) from exc
        finally:
            self._slots.release()

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # The slots bound the connections; aiohttp's own pool limit would queue inside the deadline.
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            # Each call carries its own JWT and agent token: no cookie of one call goes with the next.
            jar = aiohttp.DummyCookieJar()
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector, cookie_jar=jar)
        return self._session

    def _headers(self, agent_token: str | None) -> dict[str, str]:
        headers = {
            JWT_HEADER: self._jwt.token(),
            "Accept": "application/json",
            "User-Agent": f"gitlab-kas/{__version__}/tether",
        }
        if (request_id := current_request_id()) is not None:
            headers[REQUEST_ID_HEADER] = request_id  # follow one request from kas into the hub's logs
        if agent_token is not None:
            headers["Authorization"] = f"Bearer {agent_token}"
            headers[AGENT_TOKEN_HEADER] = agent_token
        return headers

    async def _request(self, method: str, path: str, agent_token: str | None = None, body: Any = None) -> Any:
        session = self._open_session()
        full_path = f"/api/v4/internal/kubernetes/{path}"
        async with (
            self._deadline(method, full_path),
            session.request(
                method, self._base + full_path, headers=self._headers(agent_token), json=body, allow_redirects=False
            ) as resp,
        ):
            text = await resp.text()
            if resp.status >= 300:
                raise GitlabClientError(resp.status, full_path, _reason(text))
            return json.loads(text) if text else None

    async def get_agent_info(self, agent_token: str) -> AgentInfo:
        """``GET agent_info`` with the agent token.

        Raises:
            GitlabClientError: 401 unknown/revoked token, 403, 404, or any other failure status.
            aiohttp.ClientError, TimeoutError: the hub is unreachable.
        """
        data = await self._request("GET", "agent_info", agent_token=agent_token)
        try:
            info = AgentInfo(
                agent_id=int(data["agent_id"]),
                project_id=int(data["project_id"]),
                agent_name=str(data.get("agent_name", "")),
                default_branch=str(data.get("default_branch", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GitlabClientError(502, "/api/v4/internal/kubernetes/agent_info", f"malformed answer: {exc}") from exc
        if info.agent_id <= 0 or info.project_id <= 0:
            raise GitlabClientError(
                502, "/api/v4/internal/kubernetes/agent_info", "agent_id and project_id must be > 0"
            )
        return info

    async def get_agent_configuration(self, agent_token: str) -> AgentConfigurationDoc:
        """``GET agent_configuration`` (Tether: the hub is kas' source of agent configuration).

        Raises:
            GitlabClientError: as :meth:`get_agent_info`.
        """
        data = await self._request("GET", "agent_configuration", agent_token=agent_token)
        return AgentConfigurationDoc(
            commit_id=str(data.get("commit_id", "")),
            configuration=dict(data.get("configuration") or {}),
            project_path=str(data.get("project_path", "")),
        )

    async def authorize_proxy_user(
        self, agent_id: int, access_type: str, access_key: str, csrf_token: str
    ) -> ProxyUserAuthorization:
        """``POST authorize_proxy_user``: ask whether a user may reach ``agent_id`` through the k8s proxy.

        Args:
            agent_id: the agent named in the request.
            access_type: ``personal_access_token`` or ``session_cookie`` (kas.md §4.5).
            access_key: the personal access token, or the unescaped ``_gitlab_kas`` cookie value.
            csrf_token: the CSRF token of a session cookie request; empty for a token.

        Raises:
            GitlabClientError: 401 (unknown credentials), 403 (no access to the agent), 404 (no such agent),
                any other failure status, or 502 for an answer that does not have the documented shape.
            aiohttp.ClientError, TimeoutError: the hub is unreachable.
        """
        body = {"agent_id": agent_id, "access_type": access_type, "access_key": access_key, "csrf_token": csrf_token}
        return await self._post_parsed("authorize_proxy_user", body, _proxy_user_authorization)

    async def authorize_workspace_user(
        self, name: str, dns_zone: str | None, access_type: str, access_key: str
    ) -> WorkspaceAuthorization:
        """``POST authorize_workspace_user``: ask whether the holder of these credentials owns workspace ``name``.

        Args:
            name: the workspace name from the address.
            dns_zone: the zone of a host-form address (the workspace's agent must use it), None in the path form.
            access_type: ``personal_access_token`` or ``workspace_session``.
            access_key: the token, or the workspace session cookie's value.

        Raises:
            GitlabClientError: 401 (unknown or expired credentials, a token without ``api``/``read_api``, a signed-out
                session), 403 (no such workspace, or another user's: the hub does not say which), any other
                failure status, or 502 for an answer without the documented shape.
            aiohttp.ClientError, TimeoutError: the hub is unreachable.
        """
        body = {"workspace": name, "dns_zone": dns_zone, "access_type": access_type, "access_key": access_key}
        return await self._post_parsed("authorize_workspace_user", body, _workspace_authorization)

    async def post_audit_events(self, body: bytes) -> Any:
        """``POST audit_events`` with an encoded ``{"events": [...]}`` batch (issue 25 item 1, the audit contract).

        Returns the hub's JSON answer (``{"accepted": n, "duplicates": m}``).

        Raises:
            GitlabClientError: any status from 300 on (400: a malformed batch, nothing stored).
            GitlabTimeout: the call took longer than the deadline.
            aiohttp.ClientError, OSError: the hub is unreachable.
        """
        session = self._open_session()
        full_path = "/api/v4/internal/kubernetes/audit_events"
        headers = {**self._headers(None), "Content-Type": "application/json"}
        async with (
            self._deadline("POST", full_path),
            session.post(self._base + full_path, headers=headers, data=body, allow_redirects=False) as resp,
        ):
            text = await resp.text()
            if resp.status >= 300:
                raise GitlabClientError(resp.status, full_path, _reason(text))
            return json.loads(text) if text else None

    async def _post_parsed(self, path: str, body: Any, parse: Callable[[Any], T]) -> T:
        data = await self._request("POST", path, body=body)
        try:
            return parse(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GitlabClientError(502, f"/api/v4/internal/kubernetes/{path}", f"malformed answer: {exc!r}") from exc

    async def module_request(
        self,
        agent_token: str,
        module_name: str,
        path: str,
        method: str,
        *,
        query: list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        max_response_bytes: int = 64 * 1024 * 1024,
    ) -> ModuleResponse:
        """Call ``/api/v4/internal/kubernetes/modules/<module_name><path>`` for an agent module (modules.md).

        Any status is returned as is (the module decides what it means); the module name is URL-escaped.

        Args:
            agent_token: the calling agent's token.
            module_name: e.g. ``remote_development``.
            path: the module path, starting with ``/`` (already checked by the caller).
            method: HTTP method.
            query: query parameters in order.
            headers: request headers to pass on (hop-by-hop and credentials removed by the caller).
            body: the request body.
            max_response_bytes: a longer answer is refused.

        Raises:
            GitlabClientError: 502 when the answer is longer than ``max_response_bytes``.
            GitlabTimeout: the whole call took longer than the deadline.
            aiohttp.ClientError: the hub cannot be reached.
        """
        session = self._open_session()
        full_path = f"/api/v4/internal/kubernetes/modules/{quote(module_name, safe='')}"
        url = self._base + full_path + path
        sent = {**(headers or {}), **self._headers(agent_token)}
        async with (
            self._deadline(method, full_path),
            session.request(method, url, params=query or [], headers=sent, data=body, allow_redirects=False) as resp,
        ):
            data = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > max_response_bytes:
                    raise GitlabClientError(502, url, f"answer longer than {max_response_bytes} bytes")
            answer_headers: dict[str, list[str]] = {}
            for key, value in resp.headers.items():
                answer_headers.setdefault(key, []).append(value)
            return ModuleResponse(resp.status, resp.reason or "", answer_headers, bytes(data))

    async def put_audit_recording(
        self, event_id: str, cast: bytes, complete: bool, agent_id: int, user_id: int
    ) -> None:
        """``PUT audit_events/<event_id>/recording`` with an asciicast v2 file (issue 25 item 2, the audit contract).

        ``Tether-Recording-Complete`` says whether the file holds the whole session; ``Tether-Agent-Id`` and
        ``Tether-User-Id`` let the hub decide who may replay it before the event itself arrives.

        Raises:
            GitlabClientError: any status from 300 on (413: larger than the hub keeps).
            GitlabTimeout: the call took longer than the deadline.
            aiohttp.ClientError, OSError: the hub is unreachable.
        """
        session = self._open_session()
        full_path = f"/api/v4/internal/kubernetes/audit_events/{quote(event_id, safe='')}/recording"
        headers = {
            **self._headers(None),
            "Content-Type": "application/x-asciicast",
            "Tether-Recording-Complete": "true" if complete else "false",
            "Tether-Agent-Id": str(agent_id),
            "Tether-User-Id": str(user_id),
        }
        async with (
            self._deadline("PUT", full_path),
            session.put(self._base + full_path, headers=headers, data=cast, allow_redirects=False) as resp,
        ):
            text = await resp.text()
            if resp.status >= 300:
                raise GitlabClientError(resp.status, full_path, _reason(text))

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _reason(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("error") or data)[:200]
    return str(data)[:200]


def _grants(items: Any) -> tuple[RoleGrant, ...]:
    return tuple(
        RoleGrant(id=int(item["id"]), roles=tuple(str(r) for r in item.get("roles") or ())) for item in items or ()
    )


def _proxy_user_authorization(data: Any) -> ProxyUserAuthorization:
    # Shape (kas.md §4.5): {"agent": {"id", "config_project": {"id"}}, "user": {"id", "username"},
    #                       "access_as": {"agent": {}} | {"user": {"projects": [...], "groups": [...]}}}
    access_as = data["access_as"]
    audit = data.get("audit") if isinstance(data.get("audit"), dict) else {}
    if "user" in access_as:
        user_access = access_as["user"] or {}
        projects, groups, as_user = _grants(user_access.get("projects")), _grants(user_access.get("groups")), True
    elif "agent" in access_as:
        projects, groups, as_user = (), (), False
    else:
        raise ValueError(f"access_as must hold 'agent' or 'user', got {sorted(access_as)}")
    return ProxyUserAuthorization(
        agent_id=int(data["agent"]["id"]),
        config_project_id=int(data["agent"]["config_project"]["id"]),
        user_id=int(data["user"]["id"]),
        username=str(data["user"]["username"]),
        access_as_user=as_user,
        projects=projects,
        groups=groups,
        record_sessions=audit.get("record_sessions") is True,
        credential_id=_credential_id(audit.get("credential_id")),
    )


def _credential_id(value: Any) -> int:
    # An id the hub sends, or 0: a malformed one must not refuse an otherwise valid authorization.
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63 else 0


def _workspace_authorization(data: Any) -> WorkspaceAuthorization:
    # Shape: {"workspace": {"id", "name", "namespace", "service", "agent_id", "project_id", "ports",
    #                       "actual_state", "desired_state", "message"}, "user": {"id", "username"}}
    ws, user = data["workspace"], data["user"]
    ports = tuple(sorted(int(port) for port in ws["ports"]))
    if any(not 0 < port < 65536 for port in ports):
        raise ValueError(f"ports must be 1-65535, got {ports[:10]}")
    return WorkspaceAuthorization(
        workspace_id=int(ws["id"]),
        name=str(ws["name"]),
        namespace=str(ws["namespace"]),
        agent_id=int(ws["agent_id"]),
        project_id=int(ws["project_id"]),
        ports=ports,
        actual_state=str(ws["actual_state"]),
        desired_state=str(ws["desired_state"]),
        message=str(ws.get("message") or ""),
        user_id=int(user["id"]),
        username=str(user["username"]),
        credential_id=_credential_id(
            (data.get("audit") if isinstance(data.get("audit"), dict) else {}).get("credential_id")
        ),
    )
