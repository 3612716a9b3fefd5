"""Every hub table, imported in one place so the metadata is complete (Alembic and tests use it)."""

from __future__ import annotations

from tether.hub.db.agents import AgentConfiguration, ClusterAgent, ClusterAgentToken
from tether.hub.db.audit import AuditEventRow
from tether.hub.db.audit_recordings import AuditRecording
from tether.hub.db.base import Base
from tether.hub.db.namespaces import GroupMember, Namespace, Project, ProjectMember
from tether.hub.db.revocations import PendingRevocation
from tether.hub.db.sessions import UserSession
from tether.hub.db.throttle import AuthFailureCount
from tether.hub.db.users import PersonalAccessToken, User
from tether.hub.db.workspaces import Workspace, WorkspacesAgentConfig

__all__ = [
    "AgentConfiguration",
    "AuditEventRow",
    "AuditRecording",
    "AuthFailureCount",
    "Base",
    "ClusterAgent",
    "ClusterAgentToken",
    "GroupMember",
    "Namespace",
    "PendingRevocation",
    "PersonalAccessToken",
    "Project",
    "ProjectMember",
    "User",
    "UserSession",
    "Workspace",
    "WorkspacesAgentConfig",
]
