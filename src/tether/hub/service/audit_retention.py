"""Deleting audit events past ``audit.retention_days`` (issue 25 item 1), safely from every hub replica at once.

Each replica sweeps every :data:`SWEEP_INTERVAL_S` seconds (the first sweep after a random part of it, so that
replicas started together do not sweep together). A sweep deletes the events whose ``time`` is older than the
retention, :data:`CHUNK` rows per short transaction so that ingestion never waits long behind it. Deleting is
idempotent, so two replicas sweeping at once cannot do harm; on PostgreSQL a transaction-scoped advisory lock
(:data:`LOCK_KEY`) also keeps a second replica from doing the same work twice (it skips its turn), and on
SQLite the write lock serializes them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import timedelta

from sqlalchemy import delete, select, text

from tether.hub.db.audit import AuditEventRow
from tether.hub.db.engine import Database
from tether.hub.db.types import utcnow
from tether.hub.service import audit_recordings

log = logging.getLogger(__name__)
#: Seconds between two sweeps of one replica.
SWEEP_INTERVAL_S = 3600.0
#: Rows one transaction deletes at most.
CHUNK = 5000
#: The PostgreSQL advisory lock key of the sweep (arbitrary, fixed so every hub version agrees).
LOCK_KEY = 0x7465746865726175  # "tetherau"


async def sweep(db: Database, retention_days: int, chunk: int = CHUNK) -> int:
    """Delete the events older than ``retention_days`` days; returns how many this call deleted.

    Args:
        db: the hub database.
        retention_days: ``audit.retention_days``; 0 deletes nothing.
        chunk: rows per transaction.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database failed (what was deleted before stays deleted).
    """
    if retention_days <= 0:
        return 0
    cutoff = utcnow() - timedelta(days=retention_days)
    deleted = 0
    while True:
        async with db.transaction() as session:
            if db.backend == "postgresql":
                taken = await session.scalar(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
                if not taken:
                    return deleted  # another replica is sweeping
            doomed = (
                select(AuditEventRow.seq).where(AuditEventRow.time < cutoff).order_by(AuditEventRow.seq).limit(chunk)
            )
            result = await session.execute(delete(AuditEventRow).where(AuditEventRow.seq.in_(doomed)))
            # Recorded sessions (issue 25 item 2) go with the events of their time.
            recordings = await audit_recordings.delete_older(session, cutoff, chunk)
        count = int(getattr(result, "rowcount", 0) or 0)
        deleted += count
        if count < chunk and recordings < chunk:
            return deleted
        await asyncio.sleep(0)  # let other requests in between chunks


class RetentionSweeper:
    """Runs :func:`sweep` every ``interval_s`` seconds in the running event loop.

    Args:
        db: the hub database.
        retention_days: ``audit.retention_days`` (0: the sweeper does nothing).
        interval_s: seconds between sweeps (default :data:`SWEEP_INTERVAL_S`).
    """

    def __init__(self, db: Database, retention_days: int, interval_s: float | None = None) -> None:
        self._db = db
        self._days = retention_days
        self._interval_s = SWEEP_INTERVAL_S if interval_s is None else interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sweeping (nothing when retention is 0)."""
        if self._days > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="audit-retention")

    async def _run(self) -> None:
        delay = random.uniform(0, self._interval_s)  # spreads replicas started together
        while True:
            await asyncio.sleep(delay)
            delay = self._interval_s
            try:
                deleted = await sweep(self._db, self._days)
            except Exception:  # the database is away: try again at the next sweep
                log.exception("deleting audit events older than %d days failed", self._days)
                continue
            if deleted:
                log.info("audit: %d events older than %d days deleted", deleted, self._days)

    async def close(self) -> None:
        """Stop sweeping."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
