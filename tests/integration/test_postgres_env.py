"""The private PostgreSQL server is a real one, reachable with SQLAlchemy 2 async over asyncpg."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tether_devenv.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

metadata = sa.MetaData()
agents = sa.Table(
    "agents",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("connected_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("token_digest", sa.LargeBinary, nullable=False),
)


@pytest.fixture
async def engine(postgres_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(postgres_url)
    try:
        yield eng
    finally:
        await eng.dispose()


async def test_server_is_postgresql(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        version = await conn.scalar(sa.text("SELECT version()"))
        encoding = await conn.scalar(sa.text("SHOW server_encoding"))
    assert isinstance(version, str)
    assert "PostgreSQL" in version
    assert encoding == "UTF8"


async def test_round_trip_of_rows(engine: AsyncEngine) -> None:
    ist = timezone(timedelta(hours=5, minutes=30))
    rows = [
        {
            "id": 1,
            "name": "agent-α ünïcødé 日本語 🚀",
            "connected_at": datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=ist),
            "token_digest": bytes(range(256)),
        },
        {
            "id": 2,
            "name": "plain",
            "connected_at": datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
            "token_digest": b"\x00",
        },
    ]
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(sa.insert(agents), rows)

    async with engine.connect() as conn:
        result = (await conn.execute(sa.select(agents).order_by(agents.c.id))).mappings().all()

    assert len(result) == 2
    for got, want in zip(result, rows, strict=True):
        assert got["id"] == want["id"]
        assert got["name"] == want["name"]
        assert got["connected_at"].tzinfo is not None, "timestamptz must come back timezone-aware"
        assert got["connected_at"] == want["connected_at"]  # same instant, whatever the session time zone
        assert bytes(got["token_digest"]) == want["token_digest"]


async def test_create_database_gives_a_fresh_connectable_database(postgres_server: PostgresServer) -> None:
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    dsn = postgres_server.create_database(name)
    assert dsn == f"postgresql://postgres@127.0.0.1:{postgres_server.port}/{name}"

    eng = create_async_engine(postgres_server.sqlalchemy_url_for(name))
    try:
        async with eng.connect() as conn:
            assert await conn.scalar(sa.text("SELECT current_database()")) == name
            tables = await conn.scalar(
                sa.text("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
            )
            assert tables == 0
    finally:
        await eng.dispose()
        postgres_server.drop_database(name)


async def test_dsn_shapes(postgres_server: PostgresServer) -> None:
    port = postgres_server.port
    assert postgres_server.dsn == f"postgresql://postgres@127.0.0.1:{port}/postgres"
    assert postgres_server.sqlalchemy_url == f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
