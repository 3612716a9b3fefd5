"""The async engine and transactions: SQLite (aiosqlite, the embedded default) or PostgreSQL (asyncpg).

Two connection pools (issue 27 item 3): user traffic (REST, GraphQL, the console) draws from one; the internal
API kas calls (``authorize_proxy_user``, ``agent_info``, reconcile...) from its own, chosen by :func:`kas_lane`,
so that users holding every connection of theirs cannot make kas' calls, and with them kubectl through kas, wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

_SQLITE_BUSY_TIMEOUT_S = 30.0
T = TypeVar("T")
#: Connections of the user pool on PostgreSQL: kept open, and opened on demand beyond them (SQLAlchemy's
#: ``pool_size`` and ``max_overflow``); a request beyond both waits up to ``pool_timeout`` seconds.
USER_POOL_SIZE = 10
USER_POOL_OVERFLOW = 10
#: The same for the pool of the internal API kas calls.
KAS_POOL_SIZE = 5
KAS_POOL_OVERFLOW = 10
_DEFERRED = "tether_deferred"
_KAS_LANE: ContextVar[bool] = ContextVar("tether_hub_db_kas_lane", default=False)


@contextmanager
def kas_lane() -> Iterator[None]:
    """Within this block (and tasks started in it), :class:`Database` uses the pool of the internal API."""
    token = _KAS_LANE.set(True)
    try:
        yield
    finally:
        _KAS_LANE.reset(token)


class DatabaseUrlError(ValueError):
    """The database URL is malformed or names a driver the hub does not support."""


def check_url(url: str) -> str:
    """Return the backend name (``sqlite`` or ``postgresql``) of an async SQLAlchemy ``url``.

    Args:
        url: ``sqlite+aiosqlite:///path/hub.db`` or ``postgresql+asyncpg://user@host:port/db``.

    Raises:
        DatabaseUrlError: unparsable URL or another driver.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise DatabaseUrlError(f"database url {url!r} is not a valid SQLAlchemy URL") from exc
    if parsed.drivername == "sqlite+aiosqlite":
        return "sqlite"
    if parsed.drivername == "postgresql+asyncpg":
        return "postgresql"
    raise DatabaseUrlError(
        f"database url driver {parsed.drivername!r} is not supported: use sqlite+aiosqlite:///<file> "
        "or postgresql+asyncpg://<user>@<host>:<port>/<db>"
    )


def _sqlite_setup(engine: AsyncEngine) -> None:
    # pysqlite's own transaction handling starts transactions lazily and cannot lock early; take it over so
    # every transaction is BEGIN IMMEDIATE: writers queue on the busy timeout instead of failing on upgrade.
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        # A read-only transaction (Database.transaction(read_only=True)) takes WAL's snapshot, not the write
        # lock, so a long read queues no writer.
        connection.exec_driver_sql("BEGIN" if connection.get_execution_options().get(_DEFERRED) else "BEGIN IMMEDIATE")


def _sqlite_reader_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA query_only=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Deferred: a read takes WAL's snapshot, no write lock.
        connection.exec_driver_sql("BEGIN")


def make_engine(
    url: str, echo: bool = False, pool_size: int = USER_POOL_SIZE, overflow: int = USER_POOL_OVERFLOW
) -> AsyncEngine:
    """Create the engine for ``url`` (see :func:`check_url`); SQLite gets foreign keys, WAL and a busy timeout.

    Args:
        url: as :func:`check_url`.
        echo: log every statement.
        pool_size: connections the pool keeps on PostgreSQL (SQLite keeps SQLAlchemy's pool: its writers queue
            on the file's lock whatever the pool).
        overflow: connections it opens beyond ``pool_size`` on demand (PostgreSQL).

    Raises:
        DatabaseUrlError: as :func:`check_url`.
    """
    backend = check_url(url)
    if backend == "sqlite":
        engine = create_async_engine(url, echo=echo, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S})
        _sqlite_setup(engine)
        return engine
    return create_async_engine(url, echo=echo, pool_pre_ping=True, pool_size=pool_size, max_overflow=overflow)


class Database:
    """The engines (users' and kas') plus session factories.

    Args:
        url: as :func:`check_url`.

    Attributes:
        engine: the users' engine (also migrations and the CLI).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.backend = check_url(url)
        self.engine = make_engine(url)
        self._kas_engine: AsyncEngine | None = None  # made on first use: the CLI never needs it
        self._readers: dict[int, AsyncEngine] = {}  # id(engine) -> the same engine with deferred transactions
        self._reader: Engine | None = None
        self._reader_thread: ThreadPoolExecutor | None = None
        database = make_url(url).database
        if self.backend == "sqlite" and database not in (None, "", ":memory:"):
            # aiosqlite hops to its thread for every DBAPI call (about nine per transaction, ~1 ms of CPU);
            # a read that runs whole in one thread costs one hop (issue 9: 10,000 agents ask at once).
            self._reader = create_engine(make_url(url).set(drivername="sqlite"), pool_size=1, max_overflow=0)
            _sqlite_reader_setup(self._reader)
            self._reader_thread = ThreadPoolExecutor(1, thread_name_prefix="hub-db-read")

    def lane_engine(self) -> AsyncEngine:
        """The engine of the caller's lane: kas' inside :func:`kas_lane`, else the users'."""
        if not _KAS_LANE.get():
            return self.engine
        if self._kas_engine is None:
            self._kas_engine = make_engine(self.url, pool_size=KAS_POOL_SIZE, overflow=KAS_POOL_OVERFLOW)
        return self._kas_engine

    def session(self, read_only: bool = False) -> AsyncSession:
        """A new session on the caller's lane (see :meth:`lane_engine`); the caller closes it.

        Args:
            read_only: the session only reads: on SQLite its transactions start deferred (no write lock).
        """
        engine = self.lane_engine()
        if read_only:
            engine = self._readers.setdefault(id(engine), engine.execution_options(**{_DEFERRED: True}))
        return AsyncSession(engine, expire_on_commit=False)

    @asynccontextmanager
    async def transaction(self, read_only: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction: committed when the block ends normally, rolled back when it raises.

        Args:
            read_only: as :meth:`session`.
        """
        async with self.session(read_only) as session, session.begin():
            yield session

    async def read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` (synchronous Core statements on the connection it is given) in one read-only transaction.

        For the hot paths that only read (the internal API kas calls for every agent connection). On a SQLite
        file the whole of ``work`` runs in one worker thread on a connection that cannot write
        (``PRAGMA query_only``); on PostgreSQL it runs through the async engine.

        Args:
            work: ``(connection) -> T``; it must only read (SQLite refuses writes on this connection).

        Raises:
            whatever ``work`` raises, and SQLAlchemy's errors (e.g. ``OperationalError`` after the busy timeout).
        """
        if self._reader is None or self._reader_thread is None:
            async with self.lane_engine().connect() as connection:
                return await connection.run_sync(work)
        reader = self._reader

        def in_transaction() -> T:
            with reader.begin() as connection:
                return work(connection)

        return await asyncio.get_running_loop().run_in_executor(self._reader_thread, in_transaction)

    async def close(self) -> None:
        """Dispose of the connection pools."""
        if self._reader is not None and self._reader_thread is not None:
            await asyncio.get_running_loop().run_in_executor(self._reader_thread, self._reader.dispose)
            self._reader_thread.shutdown()
        if self._kas_engine is not None:
            await self._kas_engine.dispose()
        await self.engine.dispose()
