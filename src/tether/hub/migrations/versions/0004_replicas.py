"""Several hub replicas on one database: shared failed-authentication counts and undelivered revocations.

The counts and the revocations not yet delivered to kas move from process memory into tables.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``auth_failure_counts`` and ``pending_revocations``."""
    op.create_table(
        "auth_failure_counts",
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("window_start", "source", name="pk_auth_failure_counts"),
    )
    op.create_table(
        "pending_revocations",
        sa.Column("id", _ID, nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("token_digests", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("next_attempt_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pending_revocations"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_pending_revocations_next_attempt_at", "pending_revocations", ["next_attempt_at"])


def downgrade() -> None:
    """Drop both (counts of the last two minutes; revocations kas refuses anyway once its cache expires)."""
    op.drop_index("ix_pending_revocations_next_attempt_at", table_name="pending_revocations")
    op.drop_table("pending_revocations")
    op.drop_table("auth_failure_counts")
