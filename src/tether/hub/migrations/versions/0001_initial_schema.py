"""Initial schema: users, tokens, namespaces, projects, memberships, cluster agents, agent tokens, configuration.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def _id() -> sa.Column[int]:
    return sa.Column("id", _ID, nullable=False)


def _fk(column: str, _target: str, nullable: bool = False) -> sa.Column[int]:
    return sa.Column(column, _ID, nullable=nullable)


def _fk_constraint(table: str, column: str, target_table: str, ondelete: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target_table}.id"], name=f"fk_{table}_{column}_{target_table}", ondelete=ondelete
    )


def upgrade() -> None:
    """Create every table."""
    op.create_table(
        "users",
        _id(),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("email", sa.String(255), nullable=True),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("email", name="uq_users_email"),
        sa.UniqueConstraint("username", name="uq_users_username"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "namespaces",
        _id(),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("path", sa.String(255), nullable=False),
        sa.Column("full_path", sa.String(2048), nullable=False),
        sa.Column("full_name", sa.String(4096), nullable=False),
        sa.Column("description", sa.String(2048), nullable=False),
        _fk("parent_id", "namespaces", nullable=True),
        _fk("owner_id", "users", nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        _fk_constraint("namespaces", "owner_id", "users", "CASCADE"),
        _fk_constraint("namespaces", "parent_id", "namespaces", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_namespaces"),
        sa.UniqueConstraint("full_path", name="uq_namespaces_full_path"),
        sa.UniqueConstraint("owner_id", name="uq_namespaces_owner_id"),
        sa.UniqueConstraint("parent_id", "path", name="uq_namespaces_parent_id_path"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_namespaces_parent_id", "namespaces", ["parent_id"])
    op.create_table(
        "personal_access_tokens",
        _id(),
        _fk("user_id", "users"),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("description", sa.String(255), nullable=False),
        sa.Column("token_digest", sa.String(64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("expires_at", sa.Date(), nullable=True),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("last_used_at", _TS, nullable=True),
        _fk_constraint("personal_access_tokens", "user_id", "users", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_personal_access_tokens"),
        sa.UniqueConstraint("token_digest", name="uq_personal_access_tokens_token_digest"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_personal_access_tokens_user_id", "personal_access_tokens", ["user_id"])
    op.create_table(
        "group_members",
        _id(),
        _fk("namespace_id", "namespaces"),
        _fk("user_id", "users"),
        sa.Column("access_level", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
        _fk_constraint("group_members", "namespace_id", "namespaces", "CASCADE"),
        _fk_constraint("group_members", "user_id", "users", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_group_members"),
        sa.UniqueConstraint("namespace_id", "user_id", name="uq_group_members_namespace_id_user_id"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_group_members_user_id", "group_members", ["user_id"])
    op.create_table(
        "projects",
        _id(),
        _fk("namespace_id", "namespaces"),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("path", sa.String(255), nullable=False),
        sa.Column("full_path", sa.String(2048), nullable=False),
        sa.Column("name_with_namespace", sa.String(4096), nullable=False),
        sa.Column("description", sa.String(2048), nullable=False),
        sa.Column("default_branch", sa.String(255), nullable=False),
        _fk("creator_id", "users", nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        _fk_constraint("projects", "creator_id", "users", "SET NULL"),
        _fk_constraint("projects", "namespace_id", "namespaces", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.UniqueConstraint("full_path", name="uq_projects_full_path"),
        sa.UniqueConstraint("namespace_id", "path", name="uq_projects_namespace_id_path"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_projects_namespace_id", "projects", ["namespace_id"])
    op.create_table(
        "project_members",
        _id(),
        _fk("project_id", "projects"),
        _fk("user_id", "users"),
        sa.Column("access_level", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
        _fk_constraint("project_members", "project_id", "projects", "CASCADE"),
        _fk_constraint("project_members", "user_id", "users", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_project_members"),
        sa.UniqueConstraint("project_id", "user_id", name="uq_project_members_project_id_user_id"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_project_members_user_id", "project_members", ["user_id"])
    op.create_table(
        "cluster_agents",
        _id(),
        _fk("project_id", "projects"),
        sa.Column("name", sa.String(63), nullable=False),
        _fk("created_by_user_id", "users", nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        _fk_constraint("cluster_agents", "created_by_user_id", "users", "SET NULL"),
        _fk_constraint("cluster_agents", "project_id", "projects", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_cluster_agents"),
        sa.UniqueConstraint("project_id", "name", name="uq_cluster_agents_project_id_name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "cluster_agent_tokens",
        _id(),
        _fk("agent_id", "cluster_agents"),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("description", sa.String(1024), nullable=False),
        sa.Column("token_digest", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _fk("created_by_user_id", "users", nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("last_used_at", _TS, nullable=True),
        sa.Column("revoked_at", _TS, nullable=True),
        _fk_constraint("cluster_agent_tokens", "agent_id", "cluster_agents", "CASCADE"),
        _fk_constraint("cluster_agent_tokens", "created_by_user_id", "users", "SET NULL"),
        sa.PrimaryKeyConstraint("id", name="pk_cluster_agent_tokens"),
        sa.UniqueConstraint("token_digest", name="uq_cluster_agent_tokens_token_digest"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_cluster_agent_tokens_agent_id", "cluster_agent_tokens", ["agent_id"])
    op.create_table(
        "agent_configurations",
        sa.Column("agent_id", _ID, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        _fk("updated_by_user_id", "users", nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        _fk_constraint("agent_configurations", "agent_id", "cluster_agents", "CASCADE"),
        _fk_constraint("agent_configurations", "updated_by_user_id", "users", "SET NULL"),
        sa.PrimaryKeyConstraint("agent_id", name="pk_agent_configurations"),
    )


def downgrade() -> None:
    """Drop every table, children first."""
    op.drop_table("agent_configurations")
    op.drop_index("ix_cluster_agent_tokens_agent_id", table_name="cluster_agent_tokens")
    op.drop_table("cluster_agent_tokens")
    op.drop_table("cluster_agents")
    op.drop_index("ix_project_members_user_id", table_name="project_members")
    op.drop_table("project_members")
    op.drop_index("ix_projects_namespace_id", table_name="projects")
    op.drop_table("projects")
    op.drop_index("ix_group_members_user_id", table_name="group_members")
    op.drop_table("group_members")
    op.drop_index("ix_personal_access_tokens_user_id", table_name="personal_access_tokens")
    op.drop_table("personal_access_tokens")
    op.drop_index("ix_namespaces_parent_id", table_name="namespaces")
    op.drop_table("namespaces")
    op.drop_table("users")
