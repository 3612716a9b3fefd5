"""Who may reach a workspace through kas: its owner only (issue 13; GitLab's workspaces proxy rule).

kas asks ``authorize_workspace_user`` with the workspace name from the address and the caller's credentials:
a personal access token with scope ``api`` or ``read_api``, or a workspace session cookie (a JWT kas issued
after the hub's sign-in, standing for one hub session, ``tether.modules.workspace_access.rpc.tokens``). The
answer tells kas where the workspace runs (agent, namespace, Service, ports) and its state. A workspace that
does not exist and one of another user look the same (403), so names cannot be probed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.sessions import UserSession
from tether.hub.db.types import utcnow
from tether.hub.db.users import User
from tether.hub.db.workspaces import Workspace, WorkspacesAgentConfig
from tether.hub.errors import Forbidden, Unauthorized
from tether.hub.service import users
from tether.hub.service.principal import SCOPE_API, SCOPE_READ_API
from tether.hub.workspaces.reconcile import cached_devfile
from tether.modules.remote_development.hub.desired_config import EDITOR_PORT
from tether.modules.remote_development.hub.devfile import DevfileError
from tether.modules.remote_development.states import State
from tether.modules.workspace_access import ACCESS_PAT, ACCESS_SESSION
from tether.modules.workspace_access.rpc.tokens import WorkspaceSession
from tether.tool.jwt_auth import JwtError

__all__ = ["WorkspaceAccess", "authorize_workspace_user", "exposed_ports"]

log = logging.getLogger(__name__)
#: The scopes of which a token needs one to reach a workspace.
ACCESS_SCOPES = frozenset({SCOPE_API, SCOPE_READ_API})
_NOT_OWNER = "403 Forbidden - you do not own a workspace of that name at this address"


@dataclass(frozen=True)
class WorkspaceAccess:
    """The answer: the caller owns ``workspace``.

    Attributes:
        workspace: the workspace.
        ports: its Service ports.
        user: the caller.
        credential_id: the id of the token or hub session the caller used (the audit trail, issue 25).
    """

    workspace: Workspace
    ports: list[int]
    user: User
    credential_id: int

    def to_json(self) -> dict[str, Any]:
        """The JSON body kas parses (``WorkspaceAuthorization`` in kas' hub client)."""
        ws = self.workspace
        return {
            "workspace": {
                "id": ws.id,
                "name": ws.name,
                "namespace": ws.namespace,
                "service": ws.name,
                "agent_id": ws.cluster_agent_id,
                "project_id": ws.project_id,
                "ports": self.ports,
                "actual_state": ws.actual_state,
                "desired_state": ws.desired_state,
                "message": ws.actual_state_message,
            },
            "user": {"id": self.user.id, "username": self.user.username},
            "audit": {"credential_id": self.credential_id},
        }


def exposed_ports(ws: Workspace) -> list[int]:
    """The Service ports of ``ws``: its devfile's endpoints and the injected editor's (reference §4.2)."""
    try:
        devfile = cached_devfile(ws.devfile)
    except DevfileError:
        return []
    ports = {endpoint.target_port for c in devfile.containers for endpoint in c.endpoints}
    if devfile.editor_injected:
        ports.add(EDITOR_PORT)
    return sorted(ports)


async def _token_user(session: AsyncSession, token: str) -> tuple[User, int]:
    row, user = await users.active_token(session, token)
    if not set(row.scopes) & ACCESS_SCOPES:
        log.info("workspace access refused: token %d has neither scope api nor read_api", row.id)
        raise Unauthorized("401 Unauthorized - the token needs scope api or read_api")
    return user, row.id


async def _session_user(session: AsyncSession, cookie: str, secret: bytes) -> tuple[User, int]:
    try:
        claims = WorkspaceSession.read(cookie, secret)
    except JwtError as exc:
        raise Unauthorized(f"401 Unauthorized - invalid workspace session: {exc}") from exc
    row = await session.get(UserSession, claims.session_id)
    if row is None or row.user_id != claims.user_id or row.expires_at <= utcnow():
        raise Unauthorized("401 Unauthorized - the hub session of this workspace session has ended: sign in again")
    user = await session.get_one(User, row.user_id)
    if user.state != "active":
        raise Unauthorized("401 Unauthorized - user is blocked")
    return user, row.id


async def authorize_workspace_user(
    session: AsyncSession, name: str, dns_zone: str | None, access_type: str, access_key: str, secret: bytes
) -> WorkspaceAccess:
    """Decide whether the holder of ``access_key`` may reach workspace ``name``.

    Args:
        session: open transaction.
        name: the workspace name from the address.
        dns_zone: the zone of a host-form address (the workspace's agent settings must name it), None for the
            path form.
        access_type: ``personal_access_token`` or ``workspace_session``.
        access_key: the token or the cookie value.
        secret: the gitlab secret (workspace session cookies are signed with it).

    Raises:
        Unauthorized: unknown ``access_type``; unknown, revoked or expired token or one without ``api``/``read_api``;
            an invalid cookie or one whose hub session ended (signed out, expired); a blocked user.
        Forbidden: the caller owns no workspace ``name`` (in ``dns_zone``): it does not exist, or is another's.
    """
    if access_type == ACCESS_PAT:
        user, credential_id = await _token_user(session, access_key)
    elif access_type == ACCESS_SESSION:
        user, credential_id = await _session_user(session, access_key, secret)
    else:
        raise Unauthorized(f"401 Unauthorized - unknown access_type {access_type[:40]!r}")
    query = select(Workspace).where(Workspace.name == name, Workspace.user_id == user.id)
    if dns_zone is not None:
        query = query.join(
            WorkspacesAgentConfig,
            (WorkspacesAgentConfig.cluster_agent_id == Workspace.cluster_agent_id)
            & (WorkspacesAgentConfig.version == Workspace.workspaces_agent_config_version),
        ).where(WorkspacesAgentConfig.dns_zone == dns_zone)
    # Names are unique per agent: among several, the live one, then the newest.
    rows = list(await session.scalars(query.order_by(Workspace.id.desc())))
    rows.sort(key=lambda ws: ws.actual_state == State.TERMINATED)
    if not rows:
        log.info("workspace access refused: user %d owns no workspace %s", user.id, name)
        raise Forbidden(_NOT_OWNER)
    return WorkspaceAccess(rows[0], exposed_ports(rows[0]), user, credential_id)
