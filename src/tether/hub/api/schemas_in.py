"""Request bodies. Unknown fields are rejected (``extra="forbid"``), so a typo is a 400 naming the field."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field

from tether.hub.ids import RowId


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UserCreate(_Body):
    """``POST /users`` (administrators)."""

    username: str = Field(description="Login name; also the path of the user's personal namespace.")
    name: str = Field(description="Display name.")
    email: str | None = None
    admin: bool = False


class PersonalAccessTokenCreate(_Body):
    """``POST /users/:id/personal_access_tokens`` and ``POST /user/personal_access_tokens``."""

    name: str
    scopes: list[str] = Field(description="Any of api, read_api, k8s_proxy.")
    expires_at: date | None = Field(default=None, description="First day (UTC) the token no longer works.")
    description: str = ""


class GroupCreate(_Body):
    """``POST /groups``."""

    name: str
    path: str
    parent_id: RowId | None = Field(default=None, description="Parent group id, for a subgroup.")
    description: str = ""


class ProjectCreate(_Body):
    """``POST /projects``; one of ``name`` and ``path`` is required."""

    name: str | None = None
    path: str | None = None
    namespace_id: RowId | str | None = Field(
        default=None, description="Group or user namespace (id or full path); default: your personal namespace."
    )
    description: str = ""
    default_branch: str = "main"


class MemberCreate(_Body):
    """``POST /projects/:id/members`` and ``POST /groups/:id/members``."""

    user_id: RowId | str = Field(description="User id or username.")
    access_level: int = Field(description="10 Guest, 20 Reporter, 30 Developer, 40 Maintainer, 50 Owner.")
    expires_at: date | None = None


class MemberUpdate(_Body):
    """``PUT /projects/:id/members/:user_id`` and ``PUT /groups/:id/members/:user_id``."""

    access_level: int
    expires_at: date | None = None


class AgentCreate(_Body):
    """``POST /projects/:id/cluster_agents``."""

    name: str = Field(description="A DNS label of at most 63 characters, unique in the project.")


class AgentTokenCreate(_Body):
    """``POST /projects/:id/cluster_agents/:agent_id/tokens``."""

    name: str
    description: str = ""


class AuthorizeWorkspaceUser(_Body):
    """``POST /api/v4/internal/kubernetes/authorize_workspace_user`` (kas, issue 13)."""

    workspace: str = Field(max_length=64, description="The workspace name from the address.")
    dns_zone: str | None = Field(
        default=None, max_length=256, description="The zone of a host-form address; null for the path form."
    )
    access_type: str = Field(max_length=64, description="personal_access_token or workspace_session.")
    access_key: str = Field(max_length=4096, description="The token, or the workspace session cookie's value.")


class AuthorizeProxyUser(_Body):
    """``POST /api/v4/internal/kubernetes/authorize_proxy_user`` (kas.md §4.5)."""

    agent_id: RowId
    access_type: str = Field(description="personal_access_token or session_cookie.")
    access_key: str = Field(description="The personal access token, or the _gitlab_kas cookie value.")
    csrf_token: str = Field(default="", description="The session's CSRF token (session_cookie only).")
