"""kas' audit sink: finished records become events in a bounded queue, shipped to the hub in batches.

Flow (issue 25 item 1): a relay's record is turned into an :class:`~tether.modules.audit.protocol.AuditEvent`
and appended to an in-memory queue (a deque: no lock, no await, no I/O on the request's path). One background
task, :meth:`Auditor.run`, sends the queue to the hub in batches of ``batch_max_events``, at the latest
``flush_interval`` after an event arrived. When the hub cannot take a batch (unreachable, timeout, 5xx, 404,
429) the batch and then every new event go to the local spool (``spool.py``) until the spool is empty again:
the task retries its oldest segment with the same event ids (the hub stores each id once), backing off up to
:data:`MAX_BACKOFF_S`. Events beyond ``queue_max_events`` also go to the spool, written by the task at once; a
spool at ``spool_max_bytes`` drops them, counted (``tether_kas_audit_events_total{outcome="dropped"}``) and
logged. A batch the hub refuses as malformed (400, 413, 422) is halved until the refused events are alone, and
those are dropped the same way: sending them again cannot succeed. The spool is read on start, so events
survive a kas restart, SIGKILL included.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from tether.modserver.audit import AuditRecord, AuditSink
from tether.modserver.gitlab_client import GitlabClient, GitlabClientError, GitlabTimeout
from tether.modules.audit.server.config import AuditCF
from tether.modules.audit.server.spool import Spool

if TYPE_CHECKING:
    import msgspec

__all__ = ["MAX_BACKOFF_S", "Auditor", "default_spool_dir"]

log = logging.getLogger(__name__)

#: Largest request body the hub takes (``MAX_BATCH_BYTES`` of ``protocol.py``, not imported here: the wire
#: format and msgspec load with the first event, so a kas that relays nothing does not load them).
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Longest wait between two attempts while the hub cannot take events.
MAX_BACKOFF_S = 10.0
#: Hub answers that mean "this batch can never be stored": it is dropped instead of retried.
_REFUSED = frozenset({400, 413, 422})
#: Most seconds between two "dropped" log lines.
_DROP_LOG_INTERVAL_S = 10.0


def default_spool_dir(kas_instance: str) -> Path:
    """``<tmp>/tether-kas-audit-<instance>`` with the instance name reduced to safe characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", kas_instance).strip("_") or "kas"
    return Path(tempfile.gettempdir()) / f"tether-kas-audit-{safe}"


class _Unavailable(Exception):
    """The hub cannot take a batch now; try again later."""


class Auditor(AuditSink):
    """The audit sink of a kas with auditing on (``ServerApi.audit``).

    Args:
        config: the ``audit`` section.
        gitlab: the hub's internal API client.
        kas_instance: this kas' name in events (its private API URL).
        metrics: registry for ``tether_kas_audit_events_total`` and ``tether_kas_audit_queue_events``.

    Raises:
        OSError: the spool directory cannot be created or read.
    """

    enabled = True

    def __init__(self, config: AuditCF, gitlab: GitlabClient, kas_instance: str, metrics: CollectorRegistry) -> None:
        self._config = config
        self._gitlab = gitlab
        self._instance = kas_instance
        self._spool = Spool(config.spool_dir or default_spool_dir(kas_instance), config.spool_max_bytes)
        self._queue: collections.deque[msgspec.Struct] = collections.deque()
        #: Events beyond ``queue_max_events``, waiting for the task to write them to the spool.
        self._overflow: list[msgspec.Struct] = []
        self._wake = asyncio.Event()
        self._spool_lock = asyncio.Lock()
        self._dropped_logged_at = 0.0
        self._dropped_since_log = 0
        events = Counter(
            "tether_kas_audit_events_total",
            "Audit events by what became of them: shipped to the hub, written to the local spool, or dropped",
            ["outcome"],
            registry=metrics,
        )
        self._shipped = events.labels(outcome="shipped")
        self._spooled = events.labels(outcome="spooled")
        self._dropped = events.labels(outcome="dropped")
        Gauge(
            "tether_kas_audit_queue_events", "Audit events waiting in kas' memory for the hub", registry=metrics
        ).set_function(lambda: len(self._queue) + len(self._overflow))

    # ---- the request side: no await, no I/O -------------------------------------------------------

    def finished(self, record: AuditRecord) -> None:
        """Queue the event of a finished record (see the module docstring)."""
        from tether.modules.audit.server.events import event_of  # noqa: PLC0415 (see MAX_BATCH_BYTES)

        try:
            self.record(event_of(record, self._instance))
        except Exception:  # never let auditing fail a request
            log.exception("building an audit event failed")

    def record(self, event: msgspec.Struct) -> None:
        """Queue a ready-made event; beyond ``queue_max_events`` it waits for the spool."""
        if len(self._queue) < self._config.queue_max_events:
            self._queue.append(event)
            if len(self._queue) >= self._config.batch_max_events:
                self._wake.set()
        else:
            self._overflow.append(event)
            self._wake.set()

    # ---- the task ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Ship the queue and the spool until cancelled (a supervised loop of the ``audit`` module)."""
        backoff, retry_at = 0.0, 0.0
        while True:
            await self._sleep(self._config.flush_interval)
            await self._spool_overflow()
            if not self._spool.empty:
                # Until the spool is empty, new events join it: at once (a SIGKILL keeps them), and in order.
                await self._spool_queue()
                if time.monotonic() < retry_at:
                    continue
            try:
                await self._ship_spool()
                while self._queue:
                    await self._ship_queue()
                backoff = 0.0
            except _Unavailable as exc:
                backoff = min(max(backoff * 2, self._config.flush_interval), MAX_BACKOFF_S)
                retry_at = time.monotonic() + backoff
                log.info("audit events wait in the spool: %s; next attempt in %.0f s", exc, backoff)
                await self._spool_queue()

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        if self._overflow or len(self._queue) >= self._config.batch_max_events:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _ship_queue(self) -> None:
        batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._config.batch_max_events))]
        lines = _lines(batch)
        try:
            await self._post(lines)
        except BaseException:  # not shipped, or not known to be (cancelled): sent again later, the hub dedups
            self._queue.extendleft(reversed(batch))
            raise

    async def _ship_spool(self) -> None:
        while not self._spool.empty:
            async with self._spool_lock:
                oldest = await asyncio.to_thread(self._spool.oldest)
            if oldest is None:
                return
            path, lines = oldest
            for start in range(0, len(lines), self._config.batch_max_events):
                await self._post(lines[start : start + self._config.batch_max_events])
            async with self._spool_lock:
                await asyncio.to_thread(self._spool.remove, path)

    async def _post(self, lines: list[bytes]) -> None:
        """Send encoded events in bodies under the hub's size limit; raise _Unavailable to retry later."""
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) + 16 > MAX_BATCH_BYTES:
                await self._post_one(chunk)
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        if chunk:
            await self._post_one(chunk)

    async def _post_one(self, lines: list[bytes]) -> None:
        body = b'{"events":[' + b",".join(line.rstrip(b"\n") for line in lines) + b"]}"
        try:
            await self._gitlab.post_audit_events(body)
        except GitlabClientError as exc:
            if exc.status_code not in _REFUSED:
                raise _Unavailable(f"the hub answered HTTP {exc.status_code}") from exc
            if len(lines) == 1:
                self._drop(1, f"the hub refused an event: HTTP {exc.status_code} {exc}")
                return
            # The hub stores a batch whole or not at all: halve it until the refused events are alone, so one
            # event the hub cannot take does not cost the others.
            half = len(lines) // 2
            await self._post_one(lines[:half])
            await self._post_one(lines[half:])
            return
        except GitlabTimeout as exc:
            raise _Unavailable(str(exc)) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _Unavailable(f"the hub is unreachable: {exc!r}") from exc
        self._shipped.inc(len(lines))

    async def _spool_queue(self) -> None:
        events = list(self._queue)
        self._queue.clear()
        await self._to_spool(events)

    async def _spool_overflow(self) -> None:
        events, self._overflow = self._overflow, []
        await self._to_spool(events)

    async def _to_spool(self, events: list[msgspec.Struct]) -> None:
        if not events:
            return
        lines = _lines(events)
        try:
            async with self._spool_lock:
                taken = await asyncio.to_thread(self._spool.append, lines)
        except OSError as exc:
            log.error("writing the audit spool %s failed: %s", self._spool.directory, exc)
            taken = 0
        self._spooled.inc(taken)
        if taken < len(lines):
            self._drop(len(lines) - taken, f"the spool {self._spool.directory} is full ({self._spool.size} bytes)")

    def _drop(self, count: int, why: str) -> None:
        self._dropped.inc(count)
        self._dropped_since_log += count
        now = time.monotonic()
        if now - self._dropped_logged_at >= _DROP_LOG_INTERVAL_S:
            log.error("dropped %d audit events: %s", self._dropped_since_log, why)
            self._dropped_logged_at, self._dropped_since_log = now, 0

    async def close(self, timeout_s: float) -> None:
        """On stop: try to ship what is queued within ``timeout_s``, then spool the rest and close the spool."""
        try:
            async with asyncio.timeout(timeout_s):
                if self._spool.empty:
                    while self._queue:
                        await self._ship_queue()
        except (_Unavailable, TimeoutError):
            pass
        await self._spool_overflow()
        await self._spool_queue()
        async with self._spool_lock:
            await asyncio.to_thread(self._spool.close)


def _lines(events: list[msgspec.Struct]) -> list[bytes]:
    from tether.modules.audit.server.events import encode  # noqa: PLC0415 (see MAX_BATCH_BYTES)

    return [encode(event) for event in events]
