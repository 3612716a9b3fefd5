"""The audit trail (issue 25 item 1): ``audit_events``, one row per request kas relayed or refused.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model column types: a migration must not change when the models do.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)
#: Index name -> columns (every filter of GET /api/v4/audit_events, newest first within it).
_INDEXES = {
    "ix_audit_events_time": ["time"],
    "ix_audit_events_user_id_time": ["user_id", "time"],
    "ix_audit_events_agent_id_time": ["agent_id", "time"],
    "ix_audit_events_namespace_time": ["namespace", "time"],
    "ix_audit_events_resource_time": ["resource", "time"],
}


def upgrade() -> None:
    """Create ``audit_events`` and its indexes."""
    op.create_table(
        "audit_events",
        sa.Column("seq", _ID, nullable=False),
        sa.Column("event_id", sa.String(32), nullable=False),
        sa.Column("time", _TS, nullable=False),
        sa.Column("received_at", _TS, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("kas_instance", sa.String(255), nullable=False),
        sa.Column("verb", sa.String(64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("bytes_in", sa.BigInteger(), nullable=False),
        sa.Column("bytes_out", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("token_id", sa.BigInteger(), nullable=False),
        sa.Column("token_kind", sa.String(32), nullable=False),
        sa.Column("identity_kind", sa.String(32), nullable=False),
        sa.Column("identity_user", sa.String(255), nullable=False),
        sa.Column("identity_groups", sa.Text(), nullable=False),
        sa.Column("api_group", sa.String(253), nullable=False),
        sa.Column("api_version", sa.String(64), nullable=False),
        sa.Column("resource", sa.String(253), nullable=False),
        sa.Column("subresource", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("source_address", sa.String(128), nullable=False),
        sa.Column("recording", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_audit_events"),
        sa.UniqueConstraint("event_id", name="uq_audit_events_event_id"),
        sqlite_autoincrement=True,
    )
    for name, columns in _INDEXES.items():
        op.create_index(name, "audit_events", columns)


def downgrade() -> None:
    """Drop ``audit_events``: the whole audit trail is lost."""
    for name in reversed(_INDEXES):
        op.drop_index(name, table_name="audit_events")
    op.drop_table("audit_events")
