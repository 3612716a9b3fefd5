"""kas' client for the control plane's internal API (the hub; "GitLab Rails" in the seeds).

Every call carries a ``Gitlab-Kas-Api-Request`` JWT (``iss=gitlab-kas``, ``aud=gitlab``, 30 s; kas.md §4.4).
Calls made on behalf of an agent also carry its token, as ``Authorization: Bearer`` (upstream) and as
``Gitlab-Agent-Api-Request`` (Tether's hub accepts either).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from tether import __version__
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, mint
from tether.tool.logs import REQUEST_ID_HEADER, current_request_id

T = TypeVar("T")
JWT_HEADER = "Gitlab-Kas-Api-Request"
AGENT_TOKEN_HEADER = "Gitlab-Agent-Api-Request"
_JWT_LIFETIME_S = 30.0


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


@dataclass(frozen=True)
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
    """

    agent_id: int
    config_project_id: int
    user_id: int
    username: str
    access_as_user: bool
    projects: tuple[RoleGrant, ...] = ()
    groups: tuple[RoleGrant, ...] = ()


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


class GitlabClient:
    """HTTP client for ``<address>/api/v4/internal/kubernetes/...``.

    Args:
        address: base URL of the hub, e.g. ``http://127.0.0.1:8080``.
        secret: the shared JWT secret (32 bytes).
        timeout_s: total time per request in seconds.
    """

    def __init__(self, address: str, secret: bytes, timeout_s: float = 20.0) -> None:
        self._base = address.rstrip("/")
        self._secret = secret
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self, agent_token: str | None) -> dict[str, str]:
        headers = {
            JWT_HEADER: mint(self._secret, ISSUER_KAS, AUDIENCE_GITLAB, _JWT_LIFETIME_S),
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
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self._base}/api/v4/internal/kubernetes/{path}"
        async with self._session.request(
            method, url, headers=self._headers(agent_token), json=body, allow_redirects=False
        ) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise GitlabClientError(resp.status, f"/api/v4/internal/kubernetes/{path}", _reason(text))
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
            aiohttp.ClientError, TimeoutError: the hub cannot be reached or did not answer in time.
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self._base}/api/v4/internal/kubernetes/modules/{quote(module_name, safe='')}{path}"
        sent = {**(headers or {}), **self._headers(agent_token)}
        async with self._session.request(
            method, url, params=query or [], headers=sent, data=body, allow_redirects=False
        ) as resp:
            data = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > max_response_bytes:
                    raise GitlabClientError(502, url, f"answer longer than {max_response_bytes} bytes")
            answer_headers: dict[str, list[str]] = {}
            for key, value in resp.headers.items():
                answer_headers.setdefault(key, []).append(value)
            return ModuleResponse(resp.status, resp.reason or "", answer_headers, bytes(data))

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
    )


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
    )
