"""Hub replicas that start together on an empty PostgreSQL database all come up, and migrate it once
(issue 26 item 2). Before the migration lock, the second replica's ``CREATE TABLE`` failed and it did not start."""

from __future__ import annotations

import asyncio

import pytest

from tether.hub.db import migrate
from tether.hub.db.engine import Database

pytestmark = [pytest.mark.postgres]

REPLICAS = 4


async def _together(url: str) -> list[BaseException | None]:
    databases = [Database(url) for _ in range(REPLICAS)]
    try:
        together = asyncio.gather(
            *(migrate.ensure_current(db.engine, auto_migrate=True) for db in databases), return_exceptions=True
        )
        # Without the lock they failed or waited on each other for ever; one migration takes about a second.
        results = await asyncio.wait_for(together, timeout=60)
        assert await migrate.current_revision(databases[0].engine) == migrate.head_revision()
        return list(results)
    finally:
        for db in databases:
            await db.close()


def test_replicas_migrating_an_empty_database_together_all_succeed(postgres_url: str) -> None:
    results = asyncio.run(_together(postgres_url))
    assert results == [None] * REPLICAS, results
