"""Agent tokens' ``last_used_at``, written in batches so that looking a token up stays a read (issue 9).

kas asks the hub who a token belongs to on every agent connection; after a kas restart 10,000 agents ask at
once. Each answer notes the use here, and one transaction a moment later writes every noted use.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from sqlalchemy import bindparam, case, or_, update

from tether.hub.db.agents import ClusterAgentToken
from tether.hub.db.engine import Database

log = logging.getLogger(__name__)
#: Seconds between the first unwritten use and its write.
FLUSH_DELAY_S = 1.0
#: Unwritten uses that make the write start at once (bounds memory).
MAX_PENDING = 5_000


class TokenUseWriter:
    """Collects ``(token id, time)`` uses and writes them in one transaction ``delay_s`` after the first.

    Use inside a running event loop; :meth:`close` writes what is left. A failed write is logged and its uses
    are dropped (``last_used_at`` is informative; the next use notes it again); so are the uses of a replica
    killed within ``delay_s`` of them. A write never moves ``last_used_at`` back in time, so several replicas
    writing uses of one token leave the newest.

    Args:
        db: the hub database.
        delay_s: seconds a use may wait before it is written.
        max_pending: uses that start the write at once.
    """

    def __init__(self, db: Database, delay_s: float = FLUSH_DELAY_S, max_pending: int = MAX_PENDING) -> None:
        self._db = db
        self._delay_s = delay_s
        self._max_pending = max_pending
        self._pending: dict[int, datetime] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()

    def note(self, token_id: int, when: datetime) -> None:
        """Note that token ``token_id`` was used at ``when`` (aware UTC); a use already waiting is kept."""
        self._pending.setdefault(token_id, when)
        if len(self._pending) >= self._max_pending:
            self._start_write()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay_s, self._start_write)

    def _start_write(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        uses, self._pending = self._pending, {}
        task = asyncio.get_running_loop().create_task(self._write(uses))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, uses: dict[int, datetime]) -> None:
        # Only forwards: with several hub replicas (issue 26 item 2) each notes its own uses, and a batch written
        # later may hold an older use than one another replica already wrote.
        used_at = bindparam("used_at", type_=ClusterAgentToken.last_used_at.type)
        column = ClusterAgentToken.last_used_at
        statement = (
            update(ClusterAgentToken)
            .where(ClusterAgentToken.id == bindparam("token_id"))
            .values(last_used_at=case((or_(column.is_(None), column < used_at), used_at), else_=column))
        )
        rows = [{"token_id": token_id, "used_at": when} for token_id, when in uses.items()]
        try:
            async with self._db.transaction() as session:
                await (await session.connection()).execute(statement, rows)
        except Exception:
            log.exception("writing last_used_at of %d agent tokens failed", len(rows))

    async def close(self) -> None:
        """Write what is pending and wait for every write."""
        self._start_write()
        if self._writes:
            await asyncio.gather(*self._writes)
