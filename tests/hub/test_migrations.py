"""Migrations upgrade an empty database to head, match the models exactly, and revert to an empty database."""

from __future__ import annotations

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect

from tests.fixtures.hub import TABLES
from tether.hub.db import migrate
from tether.hub.db.engine import Database
from tether.hub.db.models import Base


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
