"""Recorded exec/attach sessions (issue 25 item 2): ``audit_recordings``, one asciicast per audit event id.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``audit_recordings``."""
    op.create_table(
        "audit_recordings",
        sa.Column("event_id", sa.String(32), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("stored_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("event_id", name="pk_audit_recordings"),
    )
    op.create_index("ix_audit_recordings_agent_id", "audit_recordings", ["agent_id"])
    op.create_index("ix_audit_recordings_user_id", "audit_recordings", ["user_id"])


def downgrade() -> None:
    """Drop it (the recordings go with it)."""
    op.drop_index("ix_audit_recordings_user_id", table_name="audit_recordings")
    op.drop_index("ix_audit_recordings_agent_id", table_name="audit_recordings")
    op.drop_table("audit_recordings")
