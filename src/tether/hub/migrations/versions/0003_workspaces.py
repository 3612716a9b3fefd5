"""Workspaces (issue 12, seed 003): ``workspaces`` and the versioned ``workspaces_agent_configs``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=f"fk_{table}_{column}_{target}", ondelete="CASCADE")


def upgrade() -> None:
    """Create ``workspaces_agent_configs`` and ``workspaces``."""
    op.create_table(
        "workspaces_agent_configs",
        sa.Column("id", _ID, nullable=False),
        sa.Column("cluster_agent_id", _ID, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("dns_zone", sa.String(256), nullable=False),
        sa.Column("max_active_hours_before_stop", sa.Integer(), nullable=False),
        sa.Column("max_stopped_hours_before_termination", sa.Integer(), nullable=False),
        sa.Column("workspaces_quota", sa.Integer(), nullable=False),
        sa.Column("workspaces_per_user_quota", sa.Integer(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        _fk("workspaces_agent_configs", "cluster_agent_id", "cluster_agents"),
        sa.PrimaryKeyConstraint("id", name="pk_workspaces_agent_configs"),
        sa.UniqueConstraint("cluster_agent_id", "version", name="uq_workspaces_agent_configs_cluster_agent_id_version"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "workspaces",
        sa.Column("id", _ID, nullable=False),
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("project_id", _ID, nullable=False),
        sa.Column("cluster_agent_id", _ID, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("desired_state", sa.String(32), nullable=False),
        sa.Column("desired_state_updated_at", _TS, nullable=False),
        sa.Column("actual_state", sa.String(32), nullable=False),
        sa.Column("actual_state_updated_at", _TS, nullable=False),
        sa.Column("actual_state_message", sa.Text(), nullable=False),
        sa.Column("responded_to_agent_at", _TS, nullable=True),
        sa.Column("deployment_resource_version", sa.String(64), nullable=True),
        sa.Column("force_include_all_resources", sa.Boolean(), nullable=False),
        sa.Column("project_ref", sa.String(256), nullable=False),
        sa.Column("devfile_path", sa.String(2048), nullable=True),
        sa.Column("devfile", sa.Text(), nullable=False),
        sa.Column("url_prefix", sa.String(256), nullable=False),
        sa.Column("workspaces_agent_config_version", sa.Integer(), nullable=False),
        sa.Column("max_hours_before_termination", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        _fk("workspaces", "user_id", "users"),
        _fk("workspaces", "project_id", "projects"),
        _fk("workspaces", "cluster_agent_id", "cluster_agents"),
        sa.PrimaryKeyConstraint("id", name="pk_workspaces"),
        sa.UniqueConstraint("cluster_agent_id", "name", name="uq_workspaces_cluster_agent_id_name"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_workspaces_user_id", "workspaces", ["user_id"])
    op.create_index("ix_workspaces_project_id", "workspaces", ["project_id"])


def downgrade() -> None:
    """Drop both tables: every workspace record is lost (the cluster objects stay)."""
    op.drop_index("ix_workspaces_project_id", table_name="workspaces")
    op.drop_index("ix_workspaces_user_id", table_name="workspaces")
    op.drop_table("workspaces")
    op.drop_table("workspaces_agent_configs")
