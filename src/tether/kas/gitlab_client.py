"""kas' client for the control plane's internal API (the hub; "GitLab Rails" in the seeds).

Every call carries a ``Gitlab-Kas-Api-Request`` JWT (``iss=gitlab-kas``, ``aud=gitlab``, 30 s; kas.md §4.4).
Calls made on behalf of an agent also carry its token, as ``Authorization: Bearer`` (upstream) and as
``Gitlab-Agent-Api-Request`` (Tether's hub accepts either).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from tether import __version__
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, mint

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
