"""Several hub replicas on one database: the failed-authentication counts move from process memory into a table.

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


def upgrade() -> None:
    """Create ``auth_failure_counts``."""
    op.create_table(
        "auth_failure_counts",
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("window_start", "source", name="pk_auth_failure_counts"),
    )


def downgrade() -> None:
    """Drop ``auth_failure_counts`` (counts of the last two minutes only)."""
    op.drop_table("auth_failure_counts")
