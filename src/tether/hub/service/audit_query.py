"""Reading the audit trail: who may see which events, the filters, and an event as the API shows it.

Visibility (issue 25 item 1; AUDIT_CONTRACT.md "The hub's user API"): an administrator (and the CLI operator)
sees every event; a user sees the events made with their own identity (``user_id``) and every event of the
agents of projects where they are at least Maintainer, by the hub's role rules (direct membership, ownership
of the personal namespace, membership of an ancestor group; expired memberships do not count; see
:mod:`tether.hub.service.access`). An event of an agent since deleted is visible to administrators and to the
user who made it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, false, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.agents import ClusterAgent
from tether.hub.db.audit import AuditEventRow
from tether.hub.db.namespaces import GroupMember, Namespace, Project, ProjectMember
from tether.hub.db.types import utcnow
from tether.hub.roles import Role
from tether.hub.service.paths import is_under
from tether.hub.service.principal import Principal


@dataclass(frozen=True)
class AuditFilter:
    """What a reader asks for; None (or "") means no restriction.

    Attributes:
        user_id: events made with this user's identity.
        agent_id: events through this agent.
        verb: Kubernetes verb, HTTP method, gRPC method or ``session``, exactly.
        resource: Kubernetes resource (``pods``), exactly.
        namespace: Kubernetes namespace, exactly.
        since: events at or after this instant (event time).
        until: events before this instant.
        after: events that arrived after this cursor (``seq``; the JSON lines export).
    """

    user_id: int | None = None
    agent_id: int | None = None
    verb: str = ""
    resource: str = ""
    namespace: str = ""
    since: datetime | None = None
    until: datetime | None = None
    after: int | None = None


async def maintained_agent_ids(session: AsyncSession, user_id: int) -> list[int]:
    """The agents of every project where ``user_id`` is at least Maintainer (GitLab's inherited membership)."""
    now = utcnow()
    level = int(Role.MAINTAINER)
    direct = select(ProjectMember.project_id).where(
        ProjectMember.user_id == user_id,
        ProjectMember.access_level >= level,
        or_(ProjectMember.expires_at.is_(None), ProjectMember.expires_at > now),
    )
    owned = (
        select(Project.id).join(Namespace, Namespace.id == Project.namespace_id).where(Namespace.owner_id == user_id)
    )
    group = Namespace.__table__.alias("audit_group")
    inherited = (
        select(Project.id)
        .join(group, is_under(Project.full_path, group.c.full_path))
        .join(GroupMember, GroupMember.namespace_id == group.c.id)
        .where(
            GroupMember.user_id == user_id,
            GroupMember.access_level >= level,
            or_(GroupMember.expires_at.is_(None), GroupMember.expires_at > now),
        )
    )
    projects = direct.union(owned, inherited).subquery()
    rows = await session.scalars(select(ClusterAgent.id).where(ClusterAgent.project_id.in_(select(projects))))
    return sorted(set(rows))


async def visible(session: AsyncSession, principal: Principal) -> ColumnElement[bool] | None:
    """The condition on ``audit_events`` rows ``principal`` may read; None means every row."""
    if principal.admin or principal.user_id is None:
        return None
    agents = await maintained_agent_ids(session, principal.user_id)
    own = AuditEventRow.user_id == principal.user_id
    return or_(own, AuditEventRow.agent_id.in_(agents)) if agents else own


def events_query(wanted: AuditFilter, allowed: ColumnElement[bool] | None, newest_first: bool) -> Select[Any]:
    """``audit_events`` rows matching ``wanted`` within ``allowed``, newest first or in arrival order."""
    query = select(AuditEventRow)
    if allowed is not None:
        query = query.where(allowed)
    conditions: list[ColumnElement[bool]] = []
    if wanted.user_id is not None:
        conditions.append(AuditEventRow.user_id == wanted.user_id)
    if wanted.agent_id is not None:
        conditions.append(AuditEventRow.agent_id == wanted.agent_id)
    for column, value in (
        (AuditEventRow.verb, wanted.verb),
        (AuditEventRow.resource, wanted.resource),
        (AuditEventRow.namespace, wanted.namespace),
    ):
        if value:
            conditions.append(column == value)
    if wanted.since is not None:
        conditions.append(AuditEventRow.time >= wanted.since)
    if wanted.until is not None:
        conditions.append(AuditEventRow.time < wanted.until)
    if wanted.after is not None:
        conditions.append(AuditEventRow.seq > wanted.after)
    if wanted.since is not None and wanted.until is not None and wanted.since >= wanted.until:
        conditions.append(false())
    query = query.where(*conditions)
    if newest_first:
        return query.order_by(AuditEventRow.time.desc(), AuditEventRow.seq.desc())
    return query.order_by(AuditEventRow.seq)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_json(row: AuditEventRow) -> dict[str, Any]:
    """An event as the REST API and the JSON lines export show it: the contract's fields, times in ISO 8601.

    ``cursor`` is the event's place in arrival order (``after=<cursor>`` continues an export after it);
    ``received_at`` when the hub stored it.
    """
    identity: dict[str, Any] | None = None
    if row.identity_kind:
        identity = {"kind": row.identity_kind, "user": row.identity_user, "groups": []}
        if row.identity_groups:
            identity["groups"] = json.loads(row.identity_groups)
    return {
        "id": row.event_id,
        "cursor": row.seq,
        "time": _iso(row.time),
        "received_at": _iso(row.received_at),
        "kind": row.kind,
        "agent_id": row.agent_id,
        "kas_instance": row.kas_instance,
        "verb": row.verb,
        "status": row.status,
        "duration_ms": row.duration_ms,
        "bytes_in": row.bytes_in,
        "bytes_out": row.bytes_out,
        "user_id": row.user_id,
        "username": row.username,
        "token_id": row.token_id,
        "token_kind": row.token_kind,
        "cluster_identity": identity,
        "api_group": row.api_group,
        "api_version": row.api_version,
        "resource": row.resource,
        "subresource": row.subresource,
        "namespace": row.namespace,
        "name": row.name,
        "path": row.path,
        "request_id": row.request_id,
        "source_address": row.source_address,
        "recording": row.recording,
    }
