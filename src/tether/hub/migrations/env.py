"""Alembic environment for the hub.

The hub runs migrations itself (:mod:`tether.hub.db.migrate`) and hands this script an open connection in
``config.attributes["connection"]``. Plain ``alembic`` use (developers writing a new revision) needs
``sqlalchemy.url`` set to an async URL instead.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from tether.hub.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode recreates the table
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_url(url: str) -> None:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(_run)
    await engine.dispose()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade --sql``)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Use the connection the hub passed in, or connect to ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url (an async URL) or run migrations with `tether hub migrate`")
    asyncio.run(_run_with_url(url))


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
