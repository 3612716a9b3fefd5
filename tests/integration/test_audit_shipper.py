"""kas' audit sink with the hub unreachable (a closed port): the queue's overflow and the spool cap (issue 25).

No request waits, every event is either in the spool or counted as dropped, and the drop is logged.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tether.modserver.gitlab_client import GitlabClient
from tether.modules.audit.server.auditor import Auditor
from tether.modules.audit.server.config import AuditCF
from tether.modules.audit.server.spool import Spool


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def counted(metrics: CollectorRegistry, outcome: str) -> float:
    value = metrics.get_sample_value("tether_kas_audit_events_total", {"outcome": outcome})
    return value or 0.0


async def test_beyond_the_queue_events_go_to_the_spool_and_beyond_its_cap_are_dropped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gitlab = GitlabClient(f"http://127.0.0.1:{closed_port()}", b"k" * 32, timeout_s=2)
    config = AuditCF(
        spool_dir=tmp_path, spool_max_bytes=6_000, queue_max_events=5, batch_max_events=5, flush_interval=0.05
    )
    metrics = CollectorRegistry()
    auditor = Auditor(config, gitlab, "grpc://127.0.0.1:1", metrics)
    task = asyncio.create_task(auditor.run())
    try:
        for n in range(100):
            record = auditor.begin("kubernetes_api", "GET", f"/api/v1/namespaces/n{n}/pods", f"r{n}", "127.0.0.1")
            record.finish(200)  # returns at once: the hub is away, the spool is small
        assert metrics.get_sample_value("tether_kas_audit_queue_events") == 100
        with caplog.at_level(logging.ERROR):
            for _ in range(200):
                if counted(metrics, "spooled") + counted(metrics, "dropped") == 100:
                    break
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await gitlab.close()
    spooled, dropped = counted(metrics, "spooled"), counted(metrics, "dropped")
    assert spooled + dropped == 100 and spooled > 0 and dropped > 0 and counted(metrics, "shipped") == 0
    assert any("dropped" in r.getMessage() and "spool" in r.getMessage() for r in caplog.records)
    spool = Spool(tmp_path, 6_000)
    oldest = spool.oldest()
    assert oldest is not None and len(oldest[1]) == spooled and spool.size <= 6_000
