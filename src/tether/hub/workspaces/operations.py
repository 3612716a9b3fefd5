"""What users do with workspaces: create, change the desired state, list and read (reference §6.2; issue 12).

Authorization (GitLab "Workspaces" permissions): a Developer or above on the project may create a workspace;
only its owner (and administrators) may see or change it. Someone else's workspace is reported as not found,
so its existence does not leak.
"""

from __future__ import annotations

import logging
import re
import secrets
import string
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.agents import ClusterAgent
from tether.hub.db.namespaces import Project
from tether.hub.db.types import utcnow
from tether.hub.db.users import User
from tether.hub.db.workspaces import Workspace
from tether.hub.errors import BadRequest, Forbidden, NotFound
from tether.hub.roles import Role
from tether.hub.service.access import require_project_level
from tether.hub.service.principal import Principal
from tether.hub.workspaces import agent_settings
from tether.modules.remote_development.hub.desired_config import EDITOR_PORT
from tether.modules.remote_development.hub.devfile import DEFAULT_DEVFILE, Devfile, DevfileError, parse_devfile
from tether.modules.remote_development.states import State, parse_desired

log = logging.getLogger(__name__)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
#: What a user may ask for at creation (a workspace starts running or stopped).
CREATE_STATES = frozenset({State.RUNNING, State.STOPPED})
NOT_FOUND = "Workspace"
TERMINATED_IS_FINAL = "is 'Terminated', and cannot be updated. Create a new workspace instead."


def set_desired(ws: Workspace, state: str, now: datetime | None = None) -> None:
    """Set the desired state; touches ``desired_state_updated_at`` when it changes (upstream ``before_save``)."""
    if ws.desired_state != state:
        ws.desired_state = state
        ws.desired_state_updated_at = now or utcnow()


def set_actual(ws: Workspace, state: str, message: str = "", now: datetime | None = None) -> None:
    """Set the actual state and its reason; touches ``actual_state_updated_at`` when the state changes."""
    if ws.actual_state != state:
        ws.actual_state = state
        ws.actual_state_updated_at = now or utcnow()
    if ws.actual_state_message != message:
        ws.actual_state_message = message


@dataclass(frozen=True)
class CreateRequest:
    """What ``workspaceCreate`` takes.

    Attributes:
        cluster_agent_id, project_id: where.
        desired_state: Running or Stopped.
        project_ref: the branch or tag (recorded; the hub keeps no repositories).
        devfile_path: where the devfile lives in the project (recorded), or None for the default devfile.
        devfile: the devfile YAML (Tether: the hub has no repository to read it from); None for the default.
        name: Tether addition: a DNS-label name instead of the generated ``workspace-<agent>-<user>-<random>``.
    """

    cluster_agent_id: int
    project_id: int
    desired_state: str
    project_ref: str = "main"
    devfile_path: str | None = None
    devfile: str | None = None
    name: str | None = None


def _user(principal: Principal) -> int:
    if principal.user_id is None:
        raise Forbidden("403 Forbidden - a workspace belongs to a user: use a personal access token")
    return principal.user_id


def _root(full_path: str) -> str:
    return full_path.split("/", 1)[0]


async def create(
    session: AsyncSession,
    principal: Principal,
    request: CreateRequest,
    *,
    user_limit: int,
    default_devfile: str = DEFAULT_DEVFILE,
) -> Workspace:
    """Create a workspace owned by the principal.

    Args:
        session: open transaction.
        principal: the owner-to-be.
        request: what to create.
        user_limit: the hub's ``workspaces.max_active_workspaces_per_user`` (-1: none), checked before anything
            else about the request.
        default_devfile: the devfile used when the request has none (the hub's ``workspaces.default_devfile``).

    Raises:
        NotFound: project or agent not visible. Forbidden: below Developer on the project, or no user.
        BadRequest: naming the field: ``desiredState``, ``devfile...``, ``name``, ``clusterAgentId`` (agent in
            another top-level group, workspaces disabled, quota reached); without a field when the user has
            ``user_limit`` active workspaces already.
    """
    user_id = _user(principal)
    if not principal.can_write:
        raise Forbidden("403 Forbidden - the token needs the api scope")
    await _check_user_limit(session, user_id, user_limit)
    project = await session.get(Project, request.project_id)
    if project is None:
        raise NotFound("Project")
    await require_project_level(session, principal, project, Role.DEVELOPER)
    try:
        desired = parse_desired(request.desired_state)
    except ValueError as exc:
        raise BadRequest.field("desiredState", str(exc)) from exc
    if desired not in CREATE_STATES:
        raise BadRequest.field("desiredState", "must be Running or Stopped for a new workspace")
    agent = await session.get(ClusterAgent, request.cluster_agent_id)
    if agent is None:
        raise NotFound("Cluster agent")
    agent_project = await session.get_one(Project, agent.project_id)
    if _root(agent_project.full_path) != _root(project.full_path):
        raise BadRequest.field("clusterAgentId", "the agent must belong to the project's top-level group")
    version, settings = await agent_settings.current(session, agent.id)
    if not settings.enabled:
        raise BadRequest.field("clusterAgentId", "workspaces are not enabled in this agent's configuration")
    await _check_quotas(session, agent.id, user_id, settings.workspaces_quota, settings.workspaces_per_user_quota)
    text = request.devfile if request.devfile is not None else default_devfile
    try:
        devfile = parse_devfile(text)
    except DevfileError as exc:
        raise BadRequest.field(exc.field, exc.problem) from exc
    name, namespace = _names(agent.id, user_id, request.name, settings.shared_namespace)
    taken = await session.scalar(
        select(Workspace.id).where(Workspace.cluster_agent_id == agent.id, Workspace.name == name)
    )
    if taken is not None:
        raise BadRequest.field("name", f"{name!r} is already used by another workspace of this agent")
    now = utcnow()
    ws = Workspace(
        user_id=user_id,
        project_id=project.id,
        cluster_agent_id=agent.id,
        name=name,
        namespace=namespace,
        desired_state=desired,
        desired_state_updated_at=now,
        actual_state=State.CREATION_REQUESTED,
        actual_state_updated_at=now,
        actual_state_message="",
        responded_to_agent_at=None,
        deployment_resource_version=None,
        force_include_all_resources=True,
        project_ref=request.project_ref,
        devfile_path=request.devfile_path,
        devfile=text,
        url_prefix=f"{url_port(devfile)}-{name}",
        workspaces_agent_config_version=version,
        max_hours_before_termination=8760,
        created_at=now,
        updated_at=now,
    )
    session.add(ws)
    await session.flush()
    log.info("workspace %d %s created by user %d on agent %d", ws.id, name, user_id, agent.id)
    return ws


def url_port(devfile: Devfile) -> int:
    """The port a workspace's URL names: the injected editor's (60001, GitLab's), else the first endpoint's.

    A devfile with neither serves nothing over HTTP; its URL names the editor's port as GitLab's does, and kas
    answers that nothing serves it.
    """
    if devfile.editor_injected:
        return EDITOR_PORT
    return next((e.target_port for c in devfile.containers for e in c.endpoints), EDITOR_PORT)


def _names(agent_id: int, user_id: int, wanted: str | None, shared_namespace: str) -> tuple[str, str]:
    if wanted is None:
        suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(6))
        name = f"workspace-{agent_id}-{user_id}-{suffix}"
        namespace = f"gl-rd-ns-{agent_id}-{user_id}-{suffix}"
    else:
        if not _DNS_LABEL.match(wanted):
            raise BadRequest.field(
                "name", f"{wanted!r} is not a DNS label: lowercase letters, digits and '-', at most 63 characters"
            )
        name = wanted
        namespace = f"gl-rd-ns-{agent_id}-{wanted}"
        if len(namespace) > 63:
            raise BadRequest.field("name", f"is too long: its namespace {namespace!r} would exceed 63 characters")
    return name, shared_namespace or namespace


async def _check_quotas(session: AsyncSession, agent_id: int, user_id: int, total: int, per_user: int) -> None:
    # Counted over workspaces not desired Terminated; -1 is unlimited (reference §6.1 "Quotas").
    live = select(func.count(Workspace.id)).where(
        Workspace.cluster_agent_id == agent_id, Workspace.desired_state != State.TERMINATED
    )
    if total >= 0 and (await session.scalar(live) or 0) >= total:
        raise BadRequest.field("clusterAgentId", f"the agent's workspaces quota ({total}) is reached")
    if per_user >= 0 and (await session.scalar(live.where(Workspace.user_id == user_id)) or 0) >= per_user:
        raise BadRequest.field("clusterAgentId", f"your workspaces quota on this agent ({per_user}) is reached")


async def _check_user_limit(session: AsyncSession, user_id: int, limit: int) -> None:
    if limit < 0:
        return
    # Two creations at once must not both pass on PostgreSQL: the first locks the owner's row until it commits
    # (SQLite's transactions already write one at a time).
    await session.execute(select(User.id).where(User.id == user_id).with_for_update())
    active = await session.scalar(
        select(func.count(Workspace.id)).where(
            Workspace.user_id == user_id, Workspace.desired_state != State.TERMINATED
        )
    )
    if (active or 0) >= limit:
        raise BadRequest(
            f"you have {active} active workspaces, the most this hub allows per user "
            f"(workspaces.max_active_workspaces_per_user: {limit}): terminate one before creating another"
        )


async def get(session: AsyncSession, principal: Principal, workspace_id: int, lock: bool = False) -> Workspace:
    """A workspace the principal may see (its owner, or an administrator).

    Args:
        session: open transaction.
        principal: who asks.
        workspace_id: the workspace's id.
        lock: lock the row until the transaction ends (``FOR UPDATE`` on PostgreSQL), to change it.

    Raises:
        NotFound: no such workspace, or someone else's.
    """
    ws = await session.get(Workspace, workspace_id, with_for_update=lock)
    if ws is None or not (principal.admin or ws.user_id == principal.user_id):
        raise NotFound(NOT_FOUND)
    return ws


async def update(session: AsyncSession, principal: Principal, workspace_id: int, desired_state: str) -> Workspace:
    """Change the desired state (the only field a user changes, reference §6.2).

    Raises:
        NotFound: as :func:`get`. Forbidden: token without the api scope.
        BadRequest: unknown desired state, or the workspace is already desired Terminated (permanent).
    """
    if not principal.can_write:
        raise Forbidden("403 Forbidden - the token needs the api scope")
    # Locked: a reconcile committing meanwhile (on any hub replica) may have terminated it (issue 26 item 2).
    ws = await get(session, principal, workspace_id, lock=True)
    try:
        desired = parse_desired(desired_state)
    except ValueError as exc:
        raise BadRequest.field("desiredState", str(exc)) from exc
    if ws.desired_state == State.TERMINATED and desired != State.TERMINATED:
        raise BadRequest.field("desiredState", TERMINATED_IS_FINAL)
    set_desired(ws, desired)
    ws.updated_at = utcnow()
    log.info("workspace %d desired state %s", ws.id, desired)
    return ws


def visible_query(
    principal: Principal,
    ids: list[int] | None = None,
    project_ids: list[int] | None = None,
    agent_ids: list[int] | None = None,
    actual_states: list[str] | None = None,
) -> Select[Workspace]:
    """The principal's workspaces (all of them for an administrator), filtered, newest first."""
    query = select(Workspace).order_by(Workspace.id.desc())
    if not principal.admin:
        query = query.where(Workspace.user_id == (principal.user_id or -1))
    if ids:
        query = query.where(Workspace.id.in_(ids))
    if project_ids:
        query = query.where(Workspace.project_id.in_(project_ids))
    if agent_ids:
        query = query.where(Workspace.cluster_agent_id.in_(agent_ids))
    if actual_states:
        query = query.where(Workspace.actual_state.in_(actual_states))
    return query
