"""Response bodies, with GitLab's field names, and the functions that build them from database rows."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from pydantic import BaseModel

from tether.hub.db.agents import ClusterAgent, ClusterAgentToken
from tether.hub.db.namespaces import KIND_GROUP, Namespace, Project
from tether.hub.db.users import PersonalAccessToken, User
from tether.hub.service.agents import ConfigurationView
from tether.hub.service.members import Member
from tether.hub.service.principal import Principal
from tether.hub.service.users import token_active


class UserOut(BaseModel):
    """A user. ``email`` and ``is_admin`` are shown to administrators and to the user themselves."""

    id: int
    username: str
    name: str
    state: str
    avatar_url: str | None = None
    web_url: str
    created_at: datetime
    email: str | None = None
    is_admin: bool | None = None


def user_out(user: User, base_url: str, viewer: Principal) -> UserOut:
    """Build a :class:`UserOut`; private fields only for administrators and the user."""
    private = viewer.admin or viewer.user_id == user.id
    return UserOut(
        id=user.id,
        username=user.username,
        name=user.name,
        state=user.state,
        web_url=f"{base_url}/{user.username}",
        created_at=user.created_at,
        email=user.email if private else None,
        is_admin=user.admin if private else None,
    )


class PersonalAccessTokenOut(BaseModel):
    """A personal access token's metadata (never the token, except once in :class:`PersonalAccessTokenCreated`)."""

    id: int
    name: str
    description: str
    revoked: bool
    created_at: datetime
    scopes: list[str]
    user_id: int
    last_used_at: datetime | None
    active: bool
    expires_at: date | None


class PersonalAccessTokenCreated(PersonalAccessTokenOut):
    """The answer to creating a token: the only time the plain token is shown."""

    token: str


def pat_out(row: PersonalAccessToken) -> PersonalAccessTokenOut:
    """Build a :class:`PersonalAccessTokenOut`."""
    return PersonalAccessTokenOut(
        id=row.id,
        name=row.name,
        description=row.description,
        revoked=row.revoked,
        created_at=row.created_at,
        scopes=list(row.scopes),
        user_id=row.user_id,
        last_used_at=row.last_used_at,
        active=token_active(row),
        expires_at=row.expires_at,
    )


class NamespaceOut(BaseModel):
    """The namespace of a project."""

    id: int
    name: str
    path: str
    kind: str
    full_path: str
    parent_id: int | None
    web_url: str


class GroupOut(BaseModel):
    """A group."""

    id: int
    name: str
    path: str
    description: str
    visibility: str = "private"
    full_name: str
    full_path: str
    parent_id: int | None
    web_url: str
    created_at: datetime


def group_out(group: Namespace, base_url: str) -> GroupOut:
    """Build a :class:`GroupOut`."""
    return GroupOut(
        id=group.id,
        name=group.name,
        path=group.path,
        description=group.description,
        full_name=group.full_name,
        full_path=group.full_path,
        parent_id=group.parent_id,
        web_url=f"{base_url}/groups/{group.full_path}",
        created_at=group.created_at,
    )


class ProjectBrief(BaseModel):
    """A project as embedded in other resources (an agent's ``config_project``)."""

    id: int
    description: str
    name: str
    name_with_namespace: str
    path: str
    path_with_namespace: str
    created_at: datetime


class ProjectOut(ProjectBrief):
    """A project."""

    default_branch: str
    visibility: str = "private"
    web_url: str
    namespace: NamespaceOut
    creator_id: int | None


def project_brief(project: Project) -> ProjectBrief:
    """Build a :class:`ProjectBrief`."""
    return ProjectBrief(
        id=project.id,
        description=project.description,
        name=project.name,
        name_with_namespace=project.name_with_namespace,
        path=project.path,
        path_with_namespace=project.full_path,
        created_at=project.created_at,
    )


def project_out(project: Project, namespace: Namespace, base_url: str) -> ProjectOut:
    """Build a :class:`ProjectOut`."""
    kind_url = "groups/" if namespace.kind == KIND_GROUP else ""
    return ProjectOut(
        **project_brief(project).model_dump(),
        default_branch=project.default_branch,
        web_url=f"{base_url}/{project.full_path}",
        namespace=NamespaceOut(
            id=namespace.id,
            name=namespace.name,
            path=namespace.path,
            kind=namespace.kind,
            full_path=namespace.full_path,
            parent_id=namespace.parent_id,
            web_url=f"{base_url}/{kind_url}{namespace.full_path}",
        ),
        creator_id=project.creator_id,
    )


class MemberOut(BaseModel):
    """A member of a project or group."""

    id: int
    username: str
    name: str
    state: str
    access_level: int
    created_at: datetime
    expires_at: date | None
    web_url: str


def member_out(member: Member, base_url: str) -> MemberOut:
    """Build a :class:`MemberOut`."""
    return MemberOut(
        id=member.user.id,
        username=member.user.username,
        name=member.user.name,
        state=member.user.state,
        access_level=member.access_level,
        created_at=member.created_at,
        expires_at=member.expires_at.date() if member.expires_at else None,
        web_url=f"{base_url}/{member.user.username}",
    )


class ConnectionOut(BaseModel):
    """One live agentk connection as kas' agent tracker reports it (Tether addition)."""

    connection_id: int
    agent_version: str
    agent_commit: str
    pod_name: str
    pod_namespace: str
    connected_at: datetime | None
    kubernetes_version: str
    #: Private API URL of the kas replica holding the connection; None when the kas that registered it did not
    #: say (upstream kas).
    kas_url: str | None = None


class AgentOut(BaseModel):
    """A cluster agent (GitLab's ``ClusterAgent`` entity)."""

    id: int
    name: str
    config_project: ProjectBrief
    created_at: datetime
    created_by_user_id: int | None


class AgentDetailOut(AgentOut):
    """A cluster agent with its live connections (Tether addition).

    ``connections_error`` is None when kas answered; otherwise it says why the list is empty (kas not
    configured or unreachable).
    """

    connections: list[ConnectionOut]
    connections_error: str | None


def agent_out(agent: ClusterAgent, project: Project) -> AgentOut:
    """Build an :class:`AgentOut`."""
    return AgentOut(
        id=agent.id,
        name=agent.name,
        config_project=project_brief(project),
        created_at=agent.created_at,
        created_by_user_id=agent.created_by_user_id,
    )


class AgentTokenOut(BaseModel):
    """An agent token's metadata (never the token, except once in :class:`AgentTokenCreated`)."""

    id: int
    name: str
    description: str
    agent_id: int
    status: str
    created_at: datetime
    created_by_user_id: int | None
    last_used_at: datetime | None


class AgentTokenCreated(AgentTokenOut):
    """The answer to creating an agent token: the only time the plain token is shown."""

    token: str


def agent_token_out(row: ClusterAgentToken) -> AgentTokenOut:
    """Build an :class:`AgentTokenOut`."""
    return AgentTokenOut(
        id=row.id,
        name=row.name,
        description=row.description,
        agent_id=row.agent_id,
        status=row.status,
        created_at=row.created_at,
        created_by_user_id=row.created_by_user_id,
        last_used_at=row.last_used_at,
    )


class ConfigurationOut(BaseModel):
    """An agent's configuration file (Tether endpoint).

    ``content`` is the YAML as written; ``configuration`` the validated ``ConfigurationFile`` (protobuf JSON,
    snake_case); ``commit_id`` changes with every version, as kas sees it. ``warnings`` (on a ``PUT``) names the
    sections accepted but not served by Tether.
    """

    agent_id: int
    version: int
    commit_id: str
    content: str
    configuration: dict[str, Any]
    updated_at: datetime | None
    updated_by_user_id: int | None
    warnings: list[str] = []


def configuration_out(agent: ClusterAgent, view: ConfigurationView) -> ConfigurationOut:
    """Build a :class:`ConfigurationOut`."""
    row = view.row
    return ConfigurationOut(
        agent_id=agent.id,
        version=view.version,
        commit_id=view.commit_id,
        content=row.content if row else "",
        configuration=row.document if row else {},
        updated_at=row.updated_at if row else None,
        updated_by_user_id=row.updated_by_user_id if row else None,
        warnings=list(view.warnings),
    )
