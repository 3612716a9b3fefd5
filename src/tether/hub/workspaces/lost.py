"""Workspaces whose cluster is gone: marked Terminated with the reason, never deleted (issue 23 item 1).

When the cluster an agent serves is replaced by a new, empty one (``tether up`` recreates its development
cluster on every start), the hub still holds that agent's workspaces as they were. Left alone they would be
listed Running although nothing runs, and agentk's next full reconciliation would recreate them with empty
volumes: the user's work silently gone. Instead each one that is not Terminated yet becomes desired and actual
``Terminated`` with a message saying why (and where the old data went, when the caller kept it). The rows stay,
so the owner still sees them; agentk is never sent a Terminated workspace again (reference §2 rules).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.types import utcnow
from tether.hub.db.workspaces import Workspace
from tether.hub.workspaces.operations import set_actual, set_desired
from tether.modules.remote_development.states import State

__all__ = ["mark_lost"]


async def mark_lost(session: AsyncSession, agent_id: int, reason: str, now: datetime | None = None) -> list[str]:
    """Mark every workspace of agent ``agent_id`` not yet actually Terminated as lost; return their names.

    Args:
        session: open transaction.
        agent_id: the agent whose cluster was replaced.
        reason: the readable reason, stored as the actual state's message.
        now: the time recorded for both state changes (default: now).

    Raises:
        ValueError: ``reason`` is empty (a lost workspace must say why).
    """
    if not reason.strip():
        raise ValueError("a reason is required")
    when = now or utcnow()
    rows = await session.scalars(
        select(Workspace)
        .where(Workspace.cluster_agent_id == agent_id, Workspace.actual_state != State.TERMINATED)
        .order_by(Workspace.id)
    )
    names = []
    for ws in rows:
        set_desired(ws, State.TERMINATED, when)
        set_actual(ws, State.TERMINATED, reason, when)
        names.append(ws.name)
    return names
