"""Cluster agents, their tokens and their configuration (GitLab ``/projects/:id/cluster_agents``).

Rules (GitLab "Roles and permissions", Infrastructure: "View agents" Developer, "Manage agents" Maintainer):
Developer or above reads agents, tokens and configuration; Maintainer or above creates and deletes agents,
creates and revokes tokens, and writes the configuration. Agent names are DNS labels unique per project
(kas.md §4.1). Tokens are stored as SHA-256 digests; the plain token is returned once.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub import tokens
from tether.hub.agent_config import parse_configuration
from tether.hub.db.agents import TOKEN_ACTIVE, TOKEN_REVOKED, AgentConfiguration, ClusterAgent, ClusterAgentToken
from tether.hub.db.namespaces import Project
from tether.hub.db.types import utcnow
from tether.hub.errors import BadRequest, Conflict, NotFound
from tether.hub.roles import Role
from tether.hub.service.access import require_project_level
from tether.hub.service.principal import Principal
from tether.hub.validation import check_agent_name, check_name

log = logging.getLogger(__name__)
DESCRIPTION_MAX = 1024


async def create_agent(session: AsyncSession, principal: Principal, project: Project, name: str) -> ClusterAgent:
    """Register an agent in ``project``.

    Raises:
        NotFound: project not visible. Forbidden: below Maintainer. BadRequest: invalid name (field ``name``).
        Conflict: the project already has an agent of that name.
    """
    await require_project_level(session, principal, project, Role.MAINTAINER)
    check_agent_name(name)
    duplicate = await session.scalar(
        select(ClusterAgent.id).where(ClusterAgent.project_id == project.id, ClusterAgent.name == name)
    )
    if duplicate is not None:
        raise Conflict({"name": ["has already been taken"]})
    agent = ClusterAgent(project_id=project.id, name=name, created_by_user_id=principal.user_id, created_at=utcnow())
    session.add(agent)
    await session.flush()
    log.info("agent %d %s registered in project %d", agent.id, name, project.id)
    return agent


def agents_query(project: Project) -> Select[ClusterAgent]:
    """The agents of ``project``, by id (check read access first with :func:`readable_project`)."""
    return select(ClusterAgent).where(ClusterAgent.project_id == project.id).order_by(ClusterAgent.id)


async def readable_project(session: AsyncSession, principal: Principal, project: Project) -> None:
    """Check the principal may read agents of ``project`` (Developer+).

    Raises:
        NotFound, Forbidden.
    """
    await require_project_level(session, principal, project, Role.DEVELOPER)


async def get_agent(
    session: AsyncSession, principal: Principal, project: Project, agent_id: int, needed: Role = Role.DEVELOPER
) -> ClusterAgent:
    """Agent ``agent_id`` of ``project``, after checking the principal has ``needed`` on the project.

    Raises:
        NotFound: project not visible, or no such agent in it (``404 Agent Not Found``). Forbidden.
    """
    await require_project_level(session, principal, project, needed)
    agent = await session.get(ClusterAgent, agent_id)
    if agent is None or agent.project_id != project.id:
        raise NotFound("Agent")
    return agent


async def delete_agent(session: AsyncSession, agent: ClusterAgent) -> None:
    """Delete ``agent`` with its tokens and configuration (check Maintainer with :func:`get_agent` first)."""
    await session.delete(agent)
    await session.flush()
    log.info("agent %d deleted", agent.id)


async def create_token(
    session: AsyncSession, principal: Principal, agent: ClusterAgent, name: str, description: str = ""
) -> tuple[ClusterAgentToken, str]:
    """Create a token for ``agent``; returns the row and the plain token (shown once, never stored).

    Raises:
        BadRequest: blank or too long name, too long description.
    """
    name = check_name(name)
    if len(description) > DESCRIPTION_MAX:
        raise BadRequest.field("description", f"is too long (maximum is {DESCRIPTION_MAX} characters)")
    plain = tokens.new_agent_token()
    row = ClusterAgentToken(
        agent_id=agent.id,
        name=name,
        description=description,
        token_digest=tokens.digest(plain),
        status=TOKEN_ACTIVE,
        created_by_user_id=principal.user_id,
        created_at=utcnow(),
    )
    session.add(row)
    await session.flush()
    log.info("agent token %d created for agent %d", row.id, agent.id)
    return row, plain


def active_tokens_query(agent: ClusterAgent) -> Select[ClusterAgentToken]:
    """The agent's active tokens, by id (GitLab lists only active tokens)."""
    return (
        select(ClusterAgentToken)
        .where(ClusterAgentToken.agent_id == agent.id, ClusterAgentToken.status == TOKEN_ACTIVE)
        .order_by(ClusterAgentToken.id)
    )


async def get_token(session: AsyncSession, agent: ClusterAgent, token_id: int) -> ClusterAgentToken:
    """Active token ``token_id`` of ``agent``.

    Raises:
        NotFound: no such token, or it is revoked (GitLab answers 404 for revoked tokens).
    """
    row = await session.get(ClusterAgentToken, token_id)
    if row is None or row.agent_id != agent.id or row.status != TOKEN_ACTIVE:
        raise NotFound("Agent Token")
    return row


def revoke_token(token: ClusterAgentToken) -> None:
    """Revoke ``token``: kas' next authentication with it gets 401."""
    token.status = TOKEN_REVOKED
    token.revoked_at = utcnow()
    log.info("agent token %d of agent %d revoked", token.id, token.agent_id)


@dataclass(frozen=True)
class ConfigurationView:
    """An agent's configuration as the API shows it.

    Attributes:
        version: 0 before any configuration was set, then 1, 2, ...
        commit_id: a version identifier that changes whenever the configuration changes (kas compares it).
        row: the stored document, or None before any configuration was set.
        warnings: what the last validation accepted without serving (sections only GitLab acts on).
    """

    version: int
    commit_id: str
    row: AgentConfiguration | None
    warnings: tuple[str, ...] = ()


def commit_id(agent_id: int, version: int) -> str:
    """40 hex characters identifying configuration ``version`` of ``agent_id`` (shaped like a git commit id)."""
    return hashlib.sha1(f"tether-agent-config:{agent_id}:{version}".encode(), usedforsecurity=False).hexdigest()


async def get_configuration(session: AsyncSession, agent: ClusterAgent) -> ConfigurationView:
    """The agent's configuration (an empty one, version 0, if never set)."""
    row = await session.get(AgentConfiguration, agent.id)
    version = row.version if row is not None else 0
    return ConfigurationView(version=version, commit_id=commit_id(agent.id, version), row=row)


async def set_configuration(
    session: AsyncSession, principal: Principal, agent: ClusterAgent, content: str
) -> ConfigurationView:
    """Validate and store ``content`` (YAML) as the agent's configuration; the version grows only on change.

    Raises:
        BadRequest: the YAML is invalid (the error names the field, e.g. ``configuration.user_access.access_as``).
    """
    valid = parse_configuration(content)
    row = await session.get(AgentConfiguration, agent.id)
    if row is None:
        row = AgentConfiguration(
            agent_id=agent.id,
            version=1,
            content=valid.content,
            document=valid.document,
            updated_by_user_id=principal.user_id,
            updated_at=utcnow(),
        )
        session.add(row)
    elif row.content != valid.content:
        row.version += 1
        row.content = valid.content
        row.document = valid.document
        row.updated_by_user_id = principal.user_id
        row.updated_at = utcnow()
    await session.flush()
    log.info("configuration of agent %d is now version %d", agent.id, row.version)
    for warning in valid.warnings:
        log.warning("configuration of agent %d: %s", agent.id, warning)
    return ConfigurationView(
        version=row.version, commit_id=commit_id(agent.id, row.version), row=row, warnings=valid.warnings
    )
