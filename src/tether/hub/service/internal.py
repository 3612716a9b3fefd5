"""What kas asks the hub (kas.md §4.1, §4.4, §4.5).

Who an agent token belongs to, the agent's configuration, and whether a user may use the Kubernetes API proxy
through an agent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub import tokens
from tether.hub.agent_config import record_sessions
from tether.hub.db.agents import TOKEN_ACTIVE, AgentConfiguration, ClusterAgent, ClusterAgentToken
from tether.hub.db.engine import Database
from tether.hub.db.namespaces import KIND_GROUP, Namespace, Project
from tether.hub.db.types import utcnow
from tether.hub.db.users import User
from tether.hub.errors import Forbidden, NotFound, Unauthorized
from tether.hub.roles import Role
from tether.hub.service import sessions, users
from tether.hub.service.access import inherited_group_level, user_project_level
from tether.hub.service.agents import commit_id
from tether.hub.service.principal import SCOPE_K8S_PROXY
from tether.hub.service.token_use import TokenUseWriter

log = logging.getLogger(__name__)
#: ``last_used_at`` of an agent token is written at most this often (kas asks on every connection).
LAST_USED_UPDATE_INTERVAL = timedelta(minutes=1)
ACCESS_PAT = "personal_access_token"
ACCESS_SESSION_COOKIE = "session_cookie"


@dataclass(frozen=True)
class AgentRef:
    """An agent as the internal API reports it: ``id`` and ``name``."""

    id: int
    name: str


@dataclass(frozen=True)
class ProjectRef:
    """An agent's configuration project: ``id``, ``full_path`` (``group/project``) and ``default_branch``."""

    id: int
    full_path: str
    default_branch: str


@dataclass(frozen=True)
class AgentTokenOwner:
    """The agent an agent token belongs to.

    Attributes:
        agent: the agent.
        project: its configuration project.
    """

    agent: AgentRef
    project: ProjectRef


@dataclass(frozen=True)
class AgentConfigurationDoc:
    """What ``agent_configuration`` answers.

    Attributes:
        commit_id: changes whenever the configuration does.
        document: the stored ``ConfigurationFile`` JSON (``{}`` when never set).
        project_path: the agent's project, ``group/project``.
    """

    commit_id: str
    document: dict[str, Any]
    project_path: str


@dataclass(frozen=True)
class _TokenRow:
    token_id: int
    last_used_at: datetime | None
    owner: AgentTokenOwner


_OWNER_QUERY = (
    select(
        ClusterAgentToken.id,
        ClusterAgentToken.last_used_at,
        ClusterAgent.id,
        ClusterAgent.name,
        Project.id,
        Project.full_path,
        Project.default_branch,
    )
    .join(ClusterAgent, ClusterAgent.id == ClusterAgentToken.agent_id)
    .join(Project, Project.id == ClusterAgent.project_id)
    .where(ClusterAgentToken.token_digest == bindparam("digest"), ClusterAgentToken.status == TOKEN_ACTIVE)
)
_CONFIGURATION_QUERY = select(AgentConfiguration.version, AgentConfiguration.document).where(
    AgentConfiguration.agent_id == bindparam("agent_id")
)


def _token_row(connection: Connection, digest: str) -> _TokenRow | None:
    found = connection.execute(_OWNER_QUERY, {"digest": digest}).first()
    if found is None:
        return None
    token_id, last_used_at, agent_id, name, project_id, full_path, default_branch = found
    owner = AgentTokenOwner(AgentRef(agent_id, name), ProjectRef(project_id, full_path, default_branch))
    return _TokenRow(token_id, last_used_at, owner)


async def agent_for_token(db: Database, uses: TokenUseWriter, plain: str) -> AgentTokenOwner:
    """Resolve an agent token and note its use in ``last_used_at`` (at most once a minute, written in batches).

    A read only: kas asks on every agent connection, 10,000 agents at once after a kas restart (issue 9).

    Raises:
        Unauthorized: empty, unknown or revoked token.
    """
    owner, _ = await _resolve(db, uses, plain, with_configuration=False)
    return owner


async def configuration_for_token(db: Database, uses: TokenUseWriter, plain: str) -> AgentConfigurationDoc:
    """The configuration of the agent ``plain`` belongs to, read with the token in one transaction.

    Raises:
        Unauthorized: empty, unknown or revoked token.
    """
    owner, stored = await _resolve(db, uses, plain, with_configuration=True)
    version, document = stored if stored is not None else (0, {})
    return AgentConfigurationDoc(commit_id(owner.agent.id, version), document, owner.project.full_path)


async def _resolve(
    db: Database, uses: TokenUseWriter, plain: str, *, with_configuration: bool
) -> tuple[AgentTokenOwner, tuple[int, dict[str, Any]] | None]:
    if not plain:
        raise Unauthorized()
    digest = tokens.digest(plain)

    def read(connection: Connection) -> tuple[_TokenRow | None, tuple[int, dict[str, Any]] | None]:
        row = _token_row(connection, digest)
        if row is None or not with_configuration:
            return row, None
        stored = connection.execute(_CONFIGURATION_QUERY, {"agent_id": row.owner.agent.id}).first()
        return row, (stored[0], stored[1]) if stored is not None else None

    row, stored = await db.read(read)
    if row is None:
        raise Unauthorized()
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_UPDATE_INTERVAL:
        uses.note(row.token_id, now)
    return row.owner, stored


@dataclass(frozen=True)
class ProxyAuthorization:
    """The answer to ``authorize_proxy_user`` (upstream ``AuthorizeProxyUserResponse``, kas.md §4.5).

    Attributes:
        agent_id: the agent.
        config_project_id: its project.
        user_id, username: the authenticated user.
        access_as: ``agent`` or ``user``.
        projects, groups: for ``user``, the authorized projects/groups as (id, role labels).
    """

    agent_id: int
    config_project_id: int
    user_id: int
    username: str
    access_as: str
    projects: list[tuple[int, list[str]]] = field(default_factory=list)
    groups: list[tuple[int, list[str]]] = field(default_factory=list)
    #: Tether addition (issue 25 item 2): the configuration's ``audit.record_sessions``.
    record_sessions: bool = False
    #: Tether addition (issue 25 item 1): the id of the personal access token or browser session used, for the
    #: audit trail (never the credential itself).
    credential_id: int = 0

    def to_json(self) -> dict[str, Any]:
        """The JSON body kas parses."""
        access_as: dict[str, Any]
        if self.access_as == "agent":
            access_as = {"agent": {}}
        else:
            access_as = {
                "user": {
                    "projects": [{"id": pid, "roles": roles} for pid, roles in self.projects],
                    "groups": [{"id": gid, "roles": roles} for gid, roles in self.groups],
                }
            }
        answer: dict[str, Any] = {
            "agent": {"id": self.agent_id, "config_project": {"id": self.config_project_id}},
            "user": {"id": self.user_id, "username": self.username},
            "access_as": access_as,
        }
        # Tether's addition for the audit trail (issue 25 item 1); upstream kas discards unknown fields.
        audit: dict[str, Any] = {"credential_id": self.credential_id}
        if self.record_sessions:
            audit["record_sessions"] = True
        answer["audit"] = audit
        return answer


async def authorize_proxy_user(
    session: AsyncSession, agent_id: int, access_type: str, access_key: str, csrf_token: str = ""
) -> ProxyAuthorization:
    """Decide whether the holder of ``access_key`` may reach the cluster of agent ``agent_id`` through kas.

    Rules (GitLab ``Clusters::Agents::AuthorizeProxyUserService``, kas.md §4.5): the credential must be a valid
    personal access token with scope ``k8s_proxy``, or a live browser session with its CSRF token; the agent's
    configuration must have ``user_access`` with ``access_as``; the user must be Developer or above in a project
    or group listed there, or in the agent's own project (a Tether rule, so an agent's maintainers need no
    self-listing). Roles are reported as the user's effective role label, e.g. ``["developer"]``.

    Args:
        session: open transaction.
        agent_id: the agent the client asked for.
        access_type: ``personal_access_token`` or ``session_cookie``.
        access_key: the token, or the ``_gitlab_kas`` cookie value (URL-escaped or not).
        csrf_token: the session's CSRF token (``session_cookie`` only).

    Raises:
        Unauthorized: unknown ``access_type``; unknown/revoked/expired token; unknown, signed-out or expired
            session, or a CSRF token that is missing or not the session's; blocked user.
        Forbidden: a token without the ``k8s_proxy`` scope, no ``user_access`` in the configuration, or the user
            is not authorized.
        NotFound: no agent ``agent_id``.
    """
    if access_type == ACCESS_PAT:
        user, credential_id = await _token_user(session, access_key)
    elif access_type == ACCESS_SESSION_COOKIE:
        user, credential_id = await sessions.proxy_user(session, access_key, csrf_token)
    else:
        raise Unauthorized(f"401 Unauthorized - unknown access_type {access_type[:40]!r}")
    agent = await session.get(ClusterAgent, agent_id)
    if agent is None:
        raise NotFound("Agent")
    project = await session.get_one(Project, agent.project_id)
    config = await session.get(AgentConfiguration, agent.id)
    user_access = (config.document if config is not None else {}).get("user_access")
    if not user_access:
        raise Forbidden("403 Forbidden - `user_access` keyword is not found in agent config file.")
    access_as = user_access.get("access_as") or {}
    if len(access_as) != 1:
        raise Forbidden("403 Forbidden - `access_as` must exist only once under the `user_access` keyword.")
    projects = await _authorized_projects(session, user.id, project, user_access.get("projects", []))
    groups = await _authorized_groups(session, user.id, user_access.get("groups", []))
    if not projects and not groups:
        raise Forbidden(
            "403 Forbidden - You must be a member of `projects` or `groups` under the `user_access` keyword."
        )
    kind = "agent" if "agent" in access_as else "user"
    log.info("user %d may use agent %d's cluster as %s (%s)", user.id, agent.id, kind, access_type)
    return ProxyAuthorization(
        agent_id=agent.id,
        config_project_id=project.id,
        user_id=user.id,
        username=user.username,
        access_as=kind,
        projects=projects if kind == "user" else [],
        groups=groups if kind == "user" else [],
        record_sessions=record_sessions(config.document if config is not None else {}),
        credential_id=credential_id,
    )


async def _token_user(session: AsyncSession, plain: str) -> tuple[User, int]:
    token, user = await users.active_token(session, plain)
    if SCOPE_K8S_PROXY not in token.scopes:
        raise Forbidden("403 Forbidden - the token needs the k8s_proxy scope")
    return user, token.id


async def _authorized_projects(
    session: AsyncSession, user_id: int, own: Project, entries: list[dict[str, Any]]
) -> list[tuple[int, list[str]]]:
    candidates: dict[int, Project] = {own.id: own}
    paths = [str(entry.get("id", "")).lower() for entry in entries]
    if paths:
        for project in await session.scalars(select(Project).where(func.lower(Project.full_path).in_(paths))):
            candidates[project.id] = project
    found = []
    for project_id, project in sorted(candidates.items()):
        level = await user_project_level(session, user_id, project)
        if level >= Role.DEVELOPER:
            found.append((project_id, [Role(level).label]))
    return found


async def _authorized_groups(
    session: AsyncSession, user_id: int, entries: list[dict[str, Any]]
) -> list[tuple[int, list[str]]]:
    paths = [str(entry.get("id", "")).lower() for entry in entries]
    if not paths:
        return []
    found = []
    groups = await session.scalars(
        select(Namespace)
        .where(Namespace.kind == KIND_GROUP, func.lower(Namespace.full_path).in_(paths))
        .order_by(Namespace.id)
    )
    for group in groups:
        level = await inherited_group_level(session, user_id, group.full_path)
        if level >= Role.DEVELOPER:
            found.append((group.id, [Role(level).label]))
    return found
