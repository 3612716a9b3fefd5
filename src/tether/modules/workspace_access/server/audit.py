"""What the workspaces listener writes into a request's audit record (issue 25 item 1; ``ServerApi.audit``).

Requests for a workspace are recorded, refused ones too (401, 403, 429); those that name no workspace (a bad
address, a redirect to the canonical address) and the sign-in steps are not: they never reach an agent.
"""

from __future__ import annotations

from tether.modserver.audit import AuditRecord
from tether.modserver.gitlab_client import WorkspaceAuthorization
from tether.modules.workspace_access.server.addresses import WorkspaceAddress
from tether.modules.workspace_access.server.credentials import Credentials

__all__ = ["UNAUDITED_OUTCOMES", "audit_address", "audit_credentials", "audit_workspace"]

#: ``WorkspaceProxy`` outcomes whose request is not recorded (module docstring).
UNAUDITED_OUTCOMES = frozenset({"bad_address", "redirect", "sign_in"})


def audit_address(record: AuditRecord, address: WorkspaceAddress, upgrade: bool) -> None:
    """The workspace named and the path it sees; an upgrade (a WebSocket) is a "session"."""
    record.name = address.name
    record.path = address.path.partition("?")[0]
    if upgrade:
        record.verb = "session"


def audit_credentials(record: AuditRecord, credentials: Credentials) -> None:
    """The kind of token the caller sent."""
    record.token_kind = "session" if credentials.from_cookie else "personal_access"


def audit_workspace(record: AuditRecord, ws: WorkspaceAuthorization) -> None:
    """The hub's answer: the owner (the caller), the workspace's agent and namespace."""
    record.user_id, record.username, record.token_id = ws.user_id, ws.username, ws.credential_id
    record.agent_id = ws.agent_id
    record.namespace, record.name = ws.namespace, ws.name
    record.resource = "workspaces"
