"""``audit.retention_days``: old audit events are deleted, recent ones kept, by sweeps that may run on every replica."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from sqlalchemy import select

from tether.hub.config import ConfigError, load_config
from tether.hub.db import migrate
from tether.hub.db.audit import AuditEventRow
from tether.hub.db.engine import Database
from tether.hub.service import audit_ingest, audit_retention
from tether.modules.audit.protocol import AuditEvent

DAY = 86400.0


def _event(age_days: float) -> AuditEvent:
    return AuditEvent(
        id=uuid.uuid4().hex,
        time=time.time() - age_days * DAY,
        kind="kubernetes_api",
        agent_id=1,
        kas_instance="kas-0",
        verb="get",
        status=200,
        duration_ms=1.0,
    )


def test_retention_is_configured_in_days() -> None:
    assert load_config(None, environ={}).audit.retention_days == 90
    assert load_config(None, environ={"TETHER_HUB_AUDIT_RETENTION_DAYS": "7"}).audit.retention_days == 7
    with pytest.raises(ConfigError, match=r"audit\.retention_days"):
        load_config(None, environ={}, overrides={"audit.retention_days": -1})


def test_two_replicas_sweeping_at_once_delete_exactly_the_old_events(hub_database_url: str) -> None:
    async def check() -> None:
        replicas = [Database(hub_database_url), Database(hub_database_url)]
        try:
            await migrate.upgrade(replicas[0].engine)
            old = [_event(31 + i) for i in range(11)]
            recent = [_event(29), _event(0)]
            async with replicas[0].transaction() as session:
                assert await audit_ingest.store(session, old + recent) == 13
            assert await audit_retention.sweep(replicas[0], 0) == 0, "0 keeps events forever"
            deleted = await asyncio.gather(*(audit_retention.sweep(db, 30, chunk=3) for db in replicas))
            assert sum(deleted) == len(old)
            assert await audit_retention.sweep(replicas[1], 30) == 0
            async with replicas[1].transaction(read_only=True) as session:
                left = await session.execute(select(AuditEventRow.event_id))
                assert sorted(left.scalars()) == sorted(e.id for e in recent)
        finally:
            for db in replicas:
                await db.close()

    asyncio.run(check())


def test_a_batch_is_stored_in_the_callers_transaction(hub_database_url: str) -> None:
    """A transaction rolled back after :func:`audit_ingest.store` leaves nothing behind (both backends)."""

    async def check() -> None:
        db = Database(hub_database_url)
        try:
            await migrate.upgrade(db.engine)
            with pytest.raises(RuntimeError):
                async with db.transaction() as session:
                    assert await audit_ingest.store(session, [_event(0), _event(1)]) == 2
                    raise RuntimeError("the caller fails after storing")
            async with db.transaction(read_only=True) as session:
                assert list(await session.scalars(select(AuditEventRow.event_id))) == []
        finally:
            await db.close()

    asyncio.run(check())
