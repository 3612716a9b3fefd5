"""The reconcile service behind ``POST /api/v4/internal/kubernetes/modules/remote_development/reconcile``.

Reference §2, step by step: validate, compute each reported workspace's actual state, persist it (with the
RestartRequested -> Running flip), log orphans, run the lifecycle rules, find the workspaces to return,
build their rail_infos with ``config_to_apply`` when it must be sent, then mark them responded. All in the
caller's transaction.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime

from sqlalchemy import and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.types import utcnow
from tether.hub.db.workspaces import Workspace
from tether.hub.workspaces import agent_settings
from tether.hub.workspaces.address import editor_base_path
from tether.hub.workspaces.operations import set_actual, set_desired
from tether.modules.remote_development.hub import desired_config, rules
from tether.modules.remote_development.hub.actual_state import calculate_with_failure, waiting_reason
from tether.modules.remote_development.hub.devfile import Devfile, DevfileError, parse_devfile
from tether.modules.remote_development.hub.params import AgentInfo, parse
from tether.modules.remote_development.hub.settings import WorkspacesSettings
from tether.modules.remote_development.protocol import (
    UPDATE_FULL,
    ImagePullSecret,
    ReconcileResponse,
    ReconcileSettings,
    WorkspaceRailInfo,
)
from tether.modules.remote_development.states import State

log = logging.getLogger(__name__)

#: Desired states that switching workspaces off turns into Stopped.
_STOPPABLE = frozenset({State.RUNNING, State.RESTART_REQUESTED})


@functools.lru_cache(maxsize=512)
def cached_devfile(text: str) -> Devfile:
    """``parse_devfile(text)``, remembered.

    Devfiles never change after creation; parsing a thousand on every full sync (or one on every workspace
    request) would dominate the cost.

    Raises:
        DevfileError: the devfile no longer parses.
    """
    return parse_devfile(text)


def _timestamps(ws: Workspace) -> rules.Timestamps:
    return rules.Timestamps(
        desired_state=ws.desired_state,
        actual_state=ws.actual_state,
        desired_state_updated_at=ws.desired_state_updated_at,
        actual_state_updated_at=ws.actual_state_updated_at,
        responded_to_agent_at=ws.responded_to_agent_at,
        force_include_all_resources=ws.force_include_all_resources,
    )


def _apply_report(ws: Workspace, info: AgentInfo, now: datetime) -> None:
    state, failure = calculate_with_failure(
        info.deployment, info.termination_progress, info.error_details, info.pod_failure
    )
    set_desired(ws, rules.desired_after_report(ws.desired_state, state), now)
    if failure is not None:
        message = failure.text()
    elif state == State.ERROR:
        message = rules.error_text(info.error_message)
    elif state in (State.STARTING, State.UNKNOWN):
        message = waiting_reason(info.pod_failure)  # a cause that may resolve on its own: Starting, and why
    else:
        message = ""
    set_actual(ws, state, message, now)
    if info.resource_version is not None:
        ws.deployment_resource_version = info.resource_version
    if state in (State.UNKNOWN, State.ERROR):
        log.warning("workspace %d %s reported in abnormal actual state %s: %s", ws.id, ws.name, state, message)


async def reconcile(
    session: AsyncSession,
    agent_id: int,
    body: object,
    state_changes: list[str] | None = None,
    workspaces_url: str | None = None,
) -> ReconcileResponse:
    """Run one reconcile request of agent ``agent_id``; returns the 201 body (reference §1.4).

    Args:
        session: open transaction.
        agent_id: the calling agent.
        body: the decoded JSON request.
        state_changes: when given, receives the names of the workspaces whose desired or actual state changed
            (kas is told, so that it stops serving what it cached about them).
        workspaces_url: the hub's ``kas.workspaces_url``: in the path form the editor serves its pages under
            the workspace's path there.

    Raises:
        ParamsError: the body breaks the schema (the route answers 400 with upstream's message shape).
    """
    params = parse(body)
    now = utcnow()
    reported = {info.name: info for info in params.infos}
    version, current = await agent_settings.current(session, agent_id)
    both_terminated = and_(Workspace.desired_state == State.TERMINATED, Workspace.actual_state == State.TERMINATED)
    candidates = or_(~both_terminated, Workspace.name.in_(list(reported))) if reported else ~both_terminated
    # FOR UPDATE (PostgreSQL; SQLite's one writer serializes anyway): a user's change to a workspace committed
    # while this runs, on another hub replica or this one, would otherwise be overwritten by the state computed
    # from the row read before it (issue 26 item 2). In id order, so two reconciles of one agent cannot deadlock.
    rows = list(
        await session.scalars(
            select(Workspace)
            .where(Workspace.cluster_agent_id == agent_id, candidates)
            .order_by(Workspace.id)
            .with_for_update()
        )
    )
    settings = await agent_settings.versions(session, agent_id, {ws.workspaces_agent_config_version for ws in rows})
    settings[version] = current
    found: set[str] = set()
    changed: dict[int, Workspace] = {}
    before = {ws.id: (ws.desired_state, ws.actual_state) for ws in rows}
    for ws in rows:
        info = reported.get(ws.name)
        if info is None:
            continue
        found.add(ws.name)
        changed[ws.id] = ws
        _apply_report(ws, info, now)
        own = settings[ws.workspaces_agent_config_version]
        set_desired(
            ws,
            rules.lifecycle_desired(
                ws.desired_state,
                ws.created_at,
                ws.desired_state_updated_at,
                now,
                own.max_active_hours_before_stop,
                own.max_stopped_hours_before_termination,
            ),
            now,
        )
    for name in reported.keys() - found:
        log.warning("agent %d reported orphaned workspace %s: no such workspace", agent_id, name)
    if not current.enabled:
        # Workspaces switched off (an explicit ``enabled: false``): every workspace of the agent is stopped, and
        # its volume kept. None is terminated: only its owner or its own lifecycle limits delete it (issue 27).
        for ws in rows:
            if ws.desired_state in _STOPPABLE:
                set_desired(ws, State.STOPPED, now)
                changed[ws.id] = ws
    if state_changes is not None:
        state_changes += [ws.name for ws in changed.values() if (ws.desired_state, ws.actual_state) != before[ws.id]]
    retried = {ws.id for ws in rows if rules.retries_apply(ws.desired_state, ws.actual_state, ws.actual_state_message)}
    returned = [
        ws
        for ws in rows
        if (
            rules.returned_by_full(_timestamps(ws))
            if params.update_type == UPDATE_FULL
            else rules.returned_by_partial(_timestamps(ws), ws.name in found) or ws.id in retried
        )
    ]
    infos = [
        _rail_info(
            ws, params.update_type, settings[ws.workspaces_agent_config_version], ws.id in retried, workspaces_url
        )
        for ws in returned
    ]
    # One executemany instead of the unit of work's row-by-row flush (a partial sync may report thousands).
    updates = [
        {
            "id": ws.id,
            "desired_state": ws.desired_state,
            "desired_state_updated_at": ws.desired_state_updated_at,
            "actual_state": ws.actual_state,
            "actual_state_updated_at": ws.actual_state_updated_at,
            "actual_state_message": ws.actual_state_message,
            "deployment_resource_version": ws.deployment_resource_version,
            "updated_at": now,
        }
        for ws in changed.values()
    ]
    session.expunge_all()
    if updates:
        await session.execute(update(Workspace), updates)
    if returned:
        await session.execute(
            update(Workspace)
            .where(Workspace.id.in_([ws.id for ws in returned]))
            .values(responded_to_agent_at=now, force_include_all_resources=False)
            .execution_options(synchronize_session=False)
        )
    return ReconcileResponse(
        workspace_rails_infos=infos,
        settings=ReconcileSettings(
            full_reconciliation_interval_seconds=current.full_sync_interval_s,
            partial_reconciliation_interval_seconds=current.partial_sync_interval_s,
        ),
    )


def _rail_info(
    ws: Workspace, update_type: str, settings: WorkspacesSettings, retried: bool, workspaces_url: str | None
) -> WorkspaceRailInfo:
    # A retried Error workspace (rules.retries_apply) gets every resource, and no resource version: agentk
    # (ours and upstream's) then reports its Deployment at the next partial update even when unchanged, so
    # the workspace leaves Error as soon as an apply succeeds.
    inclusion = rules.Inclusion.ALL if retried else rules.inclusion(update_type, _timestamps(ws))
    config = ""
    if inclusion is not rules.Inclusion.NONE:
        try:
            spec = desired_config.WorkspaceSpec(
                id=ws.id,
                name=ws.name,
                namespace=ws.namespace,
                agent_id=ws.cluster_agent_id,
                desired_state=ws.desired_state,
                actual_state=ws.actual_state,
                devfile=cached_devfile(ws.devfile),
                settings=settings,
                env_variables={
                    "GL_WORKSPACE_NAME": ws.name,
                    "GL_WORKSPACE_NAMESPACE": ws.namespace,
                    "GL_WORKSPACE_DOMAIN_TEMPLATE": f"${{PORT}}-{ws.name}.{settings.dns_zone}",
                },
                editor_base_path=editor_base_path(ws.name, desired_config.EDITOR_PORT, workspaces_url),
            )
            config = desired_config.render(desired_config.resources(spec, inclusion))
        except DevfileError as exc:
            # One broken workspace must not stop the others (reference §4.3).
            log.warning("workspace %d %s: devfile no longer parses: %s", ws.id, ws.name, exc)
    return WorkspaceRailInfo(
        name=ws.name,
        namespace=ws.namespace,
        desired_state=ws.desired_state,
        actual_state=ws.actual_state,
        deployment_resource_version=None if retried else ws.deployment_resource_version,
        config_to_apply=config,
        image_pull_secrets=[ImagePullSecret(s["name"], s["namespace"]) for s in settings.image_pull_secrets],
    )
