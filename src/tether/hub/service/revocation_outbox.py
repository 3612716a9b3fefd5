"""Revocations kept in the database until a kas acknowledges them (issue 26 item 2).

No hub replica's death loses one. The hub used to deliver a revocation from the memory of the process that
committed it (issue 27 item 6): with that process killed before a kas acknowledged, the token kept working on
every kas until kas' cached answer expired. Now the revoking transaction also writes a
:class:`~tether.hub.db.revocations.PendingRevocation`. The committing replica delivers it at once, as before,
and deletes the row when a kas acknowledges (or the delivery is given up); every replica sweeps the rows
whose ``next_attempt_at`` has passed, each row by one replica at a time (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL). kas records a revocation idempotently (a set of digests in Redis), so one delivered twice, by
the dying replica and a sweep, does no harm. A replica that stops hands the revocations it still holds (its own
deliveries, the rows its sweeps claimed) to the others' sweeps at once, instead of leaving them to their lease.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import grpc
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.engine import Database
from tether.hub.db.revocations import PendingRevocation
from tether.hub.db.types import utcnow
from tether.hub.kas_client import FINAL_CODES, REVOCATION_RETRY_FOR_S, KasApiClient

log = logging.getLogger(__name__)
#: Seconds the committing replica has a revocation to itself before sweeps try it too.
LEASE_S = 60.0
#: Seconds between two sweeps of one replica, and between a sweep's attempts at one revocation.
SWEEP_INTERVAL_S = 5.0
RETRY_S = 30.0
#: Revocations one sweep takes at most (each costs a call to kas of at most ``kas.timeout``).
SWEEP_BATCH = 10


def add(
    session: AsyncSession, agent_id: int, digests_hex: list[str], lease_s: float | None = None
) -> PendingRevocation:
    """Record a revocation to deliver, in the caller's transaction (the one that revokes the tokens).

    Args:
        session: the revoking transaction.
        agent_id: the tokens' agent.
        digests_hex: the tokens' SHA-256 digests, lowercase hex.
        lease_s: seconds the caller delivers it alone before the hubs' sweeps try it too (:data:`LEASE_S`).
    """
    now = utcnow()
    row = PendingRevocation(
        agent_id=agent_id,
        token_digests=",".join(digests_hex),
        created_at=now,
        next_attempt_at=now + timedelta(seconds=LEASE_S if lease_s is None else lease_s),
    )
    session.add(row)
    return row


async def hand_over(db: Database, revocation_id: int) -> None:
    """Let the hubs' sweeps deliver a revocation now: its caller gave up (``tether hub agent token-revoke``)."""
    async with db.transaction() as session:
        row = await session.get(PendingRevocation, revocation_id)
        if row is not None:
            row.next_attempt_at = utcnow()


async def forget(db: Database, revocation_id: int) -> None:
    """Delete a revocation a kas acknowledged (or that was given up); if that fails, a sweep delivers it again."""
    try:
        async with db.transaction() as session:
            await session.execute(delete(PendingRevocation).where(PendingRevocation.id == revocation_id))
    except Exception:  # harmless: kas applies a revocation twice without effect
        log.warning("revocation %d was delivered but stays pending: a sweep delivers it again", revocation_id)


class RevocationSweeper:
    """Every ``interval_s`` seconds, delivers the revocations whose ``next_attempt_at`` has passed.

    On :meth:`close` it hands over the ones this replica holds.

    Args:
        db: the hub database.
        kas: the client of kas' api listener.
        timeout_s: deadline of each call to kas (``kas.timeout``).
        interval_s: seconds between sweeps (default :data:`SWEEP_INTERVAL_S`).
    """

    def __init__(self, db: Database, kas: KasApiClient, timeout_s: float, interval_s: float | None = None) -> None:
        self._db = db
        self._kas = kas
        self._timeout_s = timeout_s
        self._interval_s = SWEEP_INTERVAL_S if interval_s is None else interval_s
        self._task: asyncio.Task[None] | None = None
        #: Revocations this replica delivers or has claimed, not yet acknowledged or given up.
        self._held: set[int] = set()

    def holding(self, revocation_id: int) -> None:
        """This replica delivers ``revocation_id`` itself (the request that revoked): handed over if it stops first."""
        self._held.add(revocation_id)

    def released(self, revocation_id: int) -> None:
        """The delivery of ``revocation_id`` by this replica ended (acknowledged or given up)."""
        self._held.discard(revocation_id)

    def start(self) -> None:
        """Start sweeping in the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="revocation-sweeper")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.sweep()
            except Exception:  # the database is away: try again at the next sweep
                log.exception("sweeping the revocations not yet delivered to kas failed")

    async def sweep(self) -> int:
        """Try each due revocation once; returns how many were acknowledged.

        The due rows are claimed first in a short transaction (their ``next_attempt_at`` moved ``RETRY_S`` on,
        past rows another replica has locked), so no transaction stays open while kas is called: on SQLite
        that would hold the one write lock for every call.
        """
        now = utcnow()
        async with self._db.transaction() as session:
            rows = list(
                await session.scalars(
                    select(PendingRevocation)
                    .where(PendingRevocation.next_attempt_at <= now)
                    .order_by(PendingRevocation.id)
                    .limit(SWEEP_BATCH)
                    .with_for_update(skip_locked=True)
                )
            )
            for row in rows:
                row.next_attempt_at = now + timedelta(seconds=RETRY_S)
                self._held.add(row.id)
        delivered = 0
        for row in rows:
            try:
                await self._kas.revoke_agent_tokens(row.agent_id, row.token_digests.split(","), self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FINAL_CODES and (now - row.created_at).total_seconds() < REVOCATION_RETRY_FOR_S:
                    continue  # claimed until its next attempt
                log.error(
                    "kas api: revocation %d of agent %d given up: %s; kas refuses the tokens once its cached "
                    "answers expire (agent.info_cache_ttl)",
                    row.id,
                    row.agent_id,
                    exc.code().name,
                )
            else:
                log.info("kas api: revocation %d of agent %d's tokens delivered by a sweep", row.id, row.agent_id)
                delivered += 1
            await forget(self._db, row.id)
            self._held.discard(row.id)
        return delivered

    async def close(self) -> None:
        """Stop sweeping, and make what this replica holds due now: the other replicas' next sweeps deliver it."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for revocation_id in sorted(self._held):
            try:
                await hand_over(self._db, revocation_id)
            except Exception:  # the database is away: the row waits for its lease or claim to pass
                log.warning("revocation %d could not be handed over; it waits for its lease to pass", revocation_id)
        if self._held:
            log.info("%d revocation(s) handed over to the other hub replicas", len(self._held))
        self._held.clear()
