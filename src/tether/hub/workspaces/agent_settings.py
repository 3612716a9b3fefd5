"""The versioned workspaces settings of an agent (reference §6.3), kept in ``workspaces_agent_configs``."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.agents import AgentConfiguration
from tether.hub.db.types import utcnow
from tether.hub.db.workspaces import WorkspacesAgentConfig
from tether.modules.remote_development.hub.settings import WorkspacesSettings, from_configuration


async def current(session: AsyncSession, agent_id: int) -> tuple[int, WorkspacesSettings]:
    """The agent's settings from its configuration now, as (version, settings).

    A new version row is written when the settings differ from the newest one, so workspaces created from
    now on use them while older workspaces keep theirs. A configuration without a ``remote_development``
    section, or whose section no longer validates (saved before a rule existed), changes nothing: the newest
    version stays (GitLab skips the update when the section is absent; issue 27 item 7: an edit of another
    setting must not switch workspaces off). Only an agent that never had a section counts as disabled.
    """
    config = await session.get(AgentConfiguration, agent_id)
    document = config.document if config is not None else {}
    latest = await session.scalar(
        select(WorkspacesAgentConfig)
        .where(WorkspacesAgentConfig.cluster_agent_id == agent_id)
        .order_by(WorkspacesAgentConfig.version.desc())
        .limit(1)
    )
    try:
        settings = from_configuration(document["remote_development"]) if "remote_development" in document else None
    except ValueError:
        settings = None
    if settings is None:
        if latest is not None:
            return latest.version, WorkspacesSettings.from_json(latest.settings)
        settings = WorkspacesSettings()
    data = settings.to_json()
    if latest is not None and latest.settings == data:
        return latest.version, settings
    version = 1 if latest is None else latest.version + 1
    session.add(
        WorkspacesAgentConfig(
            cluster_agent_id=agent_id,
            version=version,
            enabled=settings.enabled,
            dns_zone=settings.dns_zone,
            max_active_hours_before_stop=settings.max_active_hours_before_stop,
            max_stopped_hours_before_termination=settings.max_stopped_hours_before_termination,
            workspaces_quota=settings.workspaces_quota,
            workspaces_per_user_quota=settings.workspaces_per_user_quota,
            settings=data,
            created_at=utcnow(),
        )
    )
    await session.flush()
    return version, settings


async def versions(session: AsyncSession, agent_id: int, wanted: set[int]) -> dict[int, WorkspacesSettings]:
    """Settings of the given versions of an agent (missing versions get the defaults)."""
    rows = await session.scalars(
        select(WorkspacesAgentConfig).where(
            WorkspacesAgentConfig.cluster_agent_id == agent_id, WorkspacesAgentConfig.version.in_(wanted)
        )
    )
    found = {row.version: WorkspacesSettings.from_json(row.settings) for row in rows}
    return {version: found.get(version, WorkspacesSettings()) for version in wanted}
