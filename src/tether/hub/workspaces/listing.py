"""What a list of workspaces shows beside each row: its agent, owner, project and DNS zone (one query)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.agents import ClusterAgent
from tether.hub.db.namespaces import Project
from tether.hub.db.users import User
from tether.hub.db.workspaces import Workspace, WorkspacesAgentConfig


@dataclass(frozen=True)
class Related:
    """A workspace's neighbours.

    Attributes:
        agent_name: its cluster agent's name.
        username: its owner's username.
        project_path: its project's full path.
        dns_zone: the ``remote_development.dns_zone`` of the agent settings version it was created with ("" when
            that version is missing).
    """

    agent_name: str
    username: str
    project_path: str
    dns_zone: str


async def related(session: AsyncSession, ids: Sequence[int]) -> dict[int, Related]:
    """:class:`Related` of each workspace id (ids that do not exist are left out)."""
    if not ids:
        return {}
    rows = await session.execute(
        select(Workspace.id, ClusterAgent.name, User.username, Project.full_path, WorkspacesAgentConfig.dns_zone)
        .join(ClusterAgent, ClusterAgent.id == Workspace.cluster_agent_id)
        .join(User, User.id == Workspace.user_id)
        .join(Project, Project.id == Workspace.project_id)
        .outerjoin(
            WorkspacesAgentConfig,
            and_(
                WorkspacesAgentConfig.cluster_agent_id == Workspace.cluster_agent_id,
                WorkspacesAgentConfig.version == Workspace.workspaces_agent_config_version,
            ),
        )
        .where(Workspace.id.in_(list(ids)))
    )
    return {
        workspace_id: Related(agent_name, username, project_path, dns_zone or "")
        for workspace_id, agent_name, username, project_path, dns_zone in rows
    }
