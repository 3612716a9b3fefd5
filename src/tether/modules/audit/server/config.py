"""The ``audit`` section of kas' configuration (issue 25 item 1; a Tether addition, upstream has none)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from tether.modserver.config import Section
from tether.tool.durations import Duration


class AuditCF(Section):
    """Audit events of the requests kas relays: the in-memory queue, the local spool and the batches to the hub."""

    #: Whether kas records and ships audit events at all.
    enabled: bool = True
    #: Where events wait while the hub is unreachable or the queue is full; None: a directory named after the
    #: kas instance in the system's temporary directory. Two kas must not share one.
    spool_dir: Path | None = None
    #: Most bytes the spool may hold; events beyond it are dropped (counted and logged).
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: Most events per POST to the hub (the hub takes at most 1,000).
    batch_max_events: int = Field(default=500, ge=1, le=1000)
    #: How long an event may wait in memory before its batch is sent.
    flush_interval: Duration = Field(default=1.0, gt=0)
    #: Most events waiting in memory; beyond it they go to the spool (a request never waits).
    queue_max_events: int = Field(default=10_000, ge=1)
