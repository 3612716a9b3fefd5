"""Migrations upgrade an empty database to head, match the models exactly, and revert to an empty database;
0002 (browser sessions) goes up and down on its own and leaves the rest of the data alone."""

from __future__ import annotations

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from tests.fixtures.hub import TABLES as ALL_TABLES
from tether.hub.db import migrate
from tether.hub.db.engine import Database
from tether.hub.db.models import Base

#: 0004 adds the failed-authentication counts that hub replicas share (not in the fixtures' snapshot: a
#: refused request counts there).
REPLICA_TABLES = {"auth_failure_counts", "pending_revocations"}
#: 0005 adds the audit trail (issue 25).
AUDIT_TABLES = {"audit_events"}
#: 0006 adds the recorded exec/attach sessions (issue 25 item 2).
RECORDING_TABLES = {"audit_recordings"}
TABLES = set(ALL_TABLES) | REPLICA_TABLES | AUDIT_TABLES | RECORDING_TABLES
#: What revision 0001 creates; 0002 adds the browser sessions.
TABLES_0001 = (
    TABLES
    - {"user_sessions", "workspaces", "workspaces_agent_configs"}
    - REPLICA_TABLES
    - AUDIT_TABLES
    - RECORDING_TABLES
)
#: 0003 adds the workspaces.
TABLES_0002 = TABLES_0001 | {"user_sessions"}


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names()) - {"alembic_version", "sqlite_sequence"}


def _drift(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


async def _round_trip(url: str) -> None:
    db = Database(url)
    try:
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == set()
        assert await migrate.current_revision(db.engine) is None

        await migrate.upgrade(db.engine)
        assert await migrate.current_revision(db.engine) == migrate.head_revision()
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == set(TABLES)
            assert await conn.run_sync(_drift) == [], "the migrations must create exactly what the models declare"

        await migrate.upgrade(db.engine)  # idempotent at head

        await migrate.downgrade(db.engine, "base")
        assert await migrate.current_revision(db.engine) is None
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == set()

        await migrate.upgrade(db.engine)  # and back up again
        assert await migrate.current_revision(db.engine) == migrate.head_revision()
    finally:
        await db.close()


def test_upgrade_to_head_and_downgrade_to_base(hub_database_url: str) -> None:
    asyncio.run(_round_trip(hub_database_url))


def test_auto_migrate_off_refuses_an_empty_database(hub_database_url: str) -> None:
    async def check() -> None:
        db = Database(hub_database_url)
        try:
            try:
                await migrate.ensure_current(db.engine, auto_migrate=False)
            except migrate.SchemaNotCurrent as exc:
                assert "tether hub migrate" in str(exc)
            else:
                raise AssertionError("an empty database must be refused without auto_migrate")
            await migrate.ensure_current(db.engine, auto_migrate=True)
            await migrate.ensure_current(db.engine, auto_migrate=False)
        finally:
            await db.close()

    asyncio.run(check())


async def _sessions_step(url: str) -> None:
    db = Database(url)
    try:
        await migrate.upgrade(db.engine, "0001")
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == set(TABLES_0001)
        async with db.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO users (id, username, name, admin, state, created_at) "
                    "VALUES (1, 'alice', 'Alice', false, 'active', CURRENT_TIMESTAMP)"
                )
            )

        await migrate.upgrade(db.engine, "0002")
        assert await migrate.current_revision(db.engine) == "0002"
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == TABLES_0002
        async with db.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO user_sessions (user_id, session_digest, csrf_digest, csrf_sealed, created_at, "
                    "expires_at, last_used_at) VALUES (1, 'a', 'b', 'c', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"
                )
            )

        await migrate.downgrade(db.engine, "0001")
        assert await migrate.current_revision(db.engine) == "0001"
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == set(TABLES_0001)
            assert (await conn.execute(text("SELECT username FROM users"))).scalars().all() == ["alice"]

        await migrate.upgrade(db.engine, "0002")
        async with db.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM user_sessions"))).scalar_one() == 0
    finally:
        await db.close()


async def _workspaces_step(url: str) -> None:
    db = Database(url)
    try:
        await migrate.upgrade(db.engine, "0002")
        async with db.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO users (id, username, name, admin, state, created_at) "
                    "VALUES (1, 'alice', 'Alice', false, 'active', CURRENT_TIMESTAMP)"
                )
            )
        await migrate.upgrade(db.engine)
        assert await migrate.current_revision(db.engine) == migrate.head_revision()
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == TABLES
            assert await conn.run_sync(_drift) == []
        await migrate.downgrade(db.engine, "0002")
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_tables) == TABLES_0002
            assert (await conn.execute(text("SELECT username FROM users"))).scalars().all() == ["alice"]
    finally:
        await db.close()


def test_workspaces_migration_up_and_down_keeps_other_data(hub_database_url: str) -> None:
    asyncio.run(_workspaces_step(hub_database_url))


def test_sessions_migration_up_and_down_keeps_other_data(hub_database_url: str) -> None:
    asyncio.run(_sessions_step(hub_database_url))
