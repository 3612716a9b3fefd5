"""Failed authentications per client address: sign-ins and unknown tokens (issue 9 item 4).

A client address with more than ``security.failed_auth_per_source_per_minute`` failures within a minute gets
429 (``Retry-After: 60``) before its credentials are even looked up; the refusals show in
``tether_rate_limited_total{limit="hub_auth_failures"}`` on ``/-/metrics``.

The counts live in the hub's database (table ``auth_failure_counts``), so every replica behind a load
balancer counts the same failures (issue 26 item 2): counted per process, N replicas let N times the limit
through. The hub uses no Redis, and the database is already on this path (the token is looked up there).
The window is the sliding-window counter of the ``limits`` library that kas uses: the previous minute's count
weighed by the part of it still in view, rounded down, plus the current minute's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request

from tether.hub.db.engine import Database
from tether.hub.db.throttle import AuthFailureCount
from tether.hub.errors import TooManyRequests
from tether.tool.rate_limit import RATE_LIMITED

__all__ = ["WINDOW_S", "FailedAuthThrottle"]

_NAME = "hub_auth_failures"
#: The window, in seconds.
WINDOW_S = 60


class FailedAuthThrottle:
    """Counts failures per client address in the database; see the module docstring.

    Args:
        db: the hub database.
        per_minute_limit: the limit; 0 turns the throttle off.
        clock: seconds since the epoch (tests give their own).
    """

    def __init__(self, db: Database, per_minute_limit: int, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._limit = per_minute_limit
        self._now = clock

    async def check(self, request: Request, session: AsyncSession | None = None) -> None:
        """Refuse a client address that failed too often.

        Args:
            request: the request; its client address is counted.
            session: the request's transaction, when it has one: the count is read there, so a request still
                opens one transaction (issue 27 item 3); without one, on a read connection.

        Raises:
            TooManyRequests: over the limit.
            sqlalchemy.exc.SQLAlchemyError: the database failed (the request fails, as its token look-up would).
        """
        if self._limit <= 0:
            return
        now = self._now()
        window = int(now // WINDOW_S)
        query = select(AuthFailureCount.window_start, AuthFailureCount.failures).where(
            AuthFailureCount.window_start.in_((window - 1, window)), AuthFailureCount.source == _source(request)
        )
        if session is not None:
            rows = (await session.execute(query)).all()
        else:
            rows = await self._db.read(lambda connection: connection.execute(query).all())
        counts = {int(start): int(failures) for start, failures in rows}
        in_view = 1.0 - (now - window * WINDOW_S) / WINDOW_S
        weighed = counts.get(window - 1, 0) * in_view + counts.get(window, 0)
        if math.floor(weighed) >= self._limit:
            RATE_LIMITED.labels(limit=_NAME).inc()
            raise TooManyRequests()

    async def failed(self, request: Request) -> None:
        """Count one failed authentication of the request's client address; forget minutes out of view.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        if self._limit <= 0:
            return
        window = int(self._now() // WINDOW_S)
        async with self._db.transaction() as session:
            insert = pg_insert if self._db.engine.dialect.name == "postgresql" else sqlite_insert
            statement = insert(AuthFailureCount).values(window_start=window, source=_source(request), failures=1)
            await session.execute(
                statement.on_conflict_do_update(
                    index_elements=[AuthFailureCount.window_start, AuthFailureCount.source],
                    set_={"failures": AuthFailureCount.failures + 1},
                )
            )
            await session.execute(delete(AuthFailureCount).where(AuthFailureCount.window_start < window - 1))


def _source(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"
