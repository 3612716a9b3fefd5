"""Alembic migrations run programmatically over the hub's async engine (``tether hub migrate``, auto-migrate)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
#: The PostgreSQL advisory lock (a bigint key) that migrating hubs take in turn: several replicas start together
#: on one database (issue 26 item 2), and without it two ran the same ``CREATE TABLE`` and one failed to start.
#: The value is arbitrary; it is fixed so that every hub version agrees on it.
MIGRATION_LOCK_KEY = 0x7465746865726D67  # "tethermg"


class SchemaNotCurrent(RuntimeError):
    """The database is not at the newest migration and automatic migration is off."""


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic configuration pointing at the hub's migrations; ``connection`` is used by ``env.py`` when given."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (default: the newest) in one transaction.

    Raises:
        alembic.util.CommandError: unknown revision.
        sqlalchemy.exc.SQLAlchemyError: the database refused a statement.
    """

    def run(connection: Connection) -> None:
        _serialize(connection)
        command.upgrade(alembic_config(connection), revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    """Revert migrations down to ``revision`` (``base`` removes every table).

    Raises:
        alembic.util.CommandError: unknown revision.
    """

    def run(connection: Connection) -> None:
        _serialize(connection)
        command.downgrade(alembic_config(connection), revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)


def _serialize(connection: Connection) -> None:
    """Wait for the migration lock on PostgreSQL; it is released when the caller's transaction ends.

    The second hub then finds the schema at head and has nothing to do. SQLite serializes writers itself (one
    file, one writer: only one hub uses it).
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at, or None for an empty database."""

    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def ensure_current(engine: AsyncEngine, auto_migrate: bool) -> None:
    """Migrate to head when ``auto_migrate``; otherwise check the schema is at head.

    Raises:
        SchemaNotCurrent: ``auto_migrate`` is off and the database is behind (the message says what to run).
    """
    if auto_migrate:
        await upgrade(engine)
        return
    current = await current_revision(engine)
    head = head_revision()
    if current != head:
        raise SchemaNotCurrent(
            f"the database schema is at {current or 'nothing (empty database)'}, the hub needs {head}: "
            "run `tether hub migrate` or enable auto_migrate"
        )
