"""Sustained ingestion of audit events into PostgreSQL through the hub's internal endpoint (issue 25 item 1).

Usage: ``python bench/audit_hub.py [--seconds 30] [--senders 2] [--batch 500] [--runs 1]``

A private PostgreSQL, one ``tether hub serve`` process on it, and ``--senders`` clients standing for kas
instances, each posting batches of ``--batch`` events (kas' ``audit.batch_max_events`` default) to
``POST /api/v4/internal/kubernetes/audit_events`` with kas' JWT, the next batch as soon as the last is answered,
for ``--seconds`` after a 3 s warm-up. Every event is new (its own uuid4 id), shaped like a Kubernetes API
proxy call through kas with an impersonated user. The batches are encoded before the load starts (enough for
8,000 events/s; more are made on the fly if that runs out), so that the senders, which stand for kas on other
machines, take little of the two cores the hub and PostgreSQL share with them.

Figure (``bench/results/audit.json``, this script's entry only; the file is shared with h-audit-kas and
h-record): ``audit_events_per_second_hub``, events the hub stored per second (target >= 5,000). The script
checks the table holds exactly the events the hub said it accepted. Beside the figure: the CPU time the hub
process and PostgreSQL (its server and backends) spent per event while measured, read from ``/proc``, which
the load of other processes on the machine changes far less than the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import msgspec
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.hub_replicas import rows
from tests.fixtures.system import TETHER
from tether.modules.audit.protocol import AuditEvent, ClusterIdentity
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, mint
from tether_devenv.postgres_server import PostgresServer
from tether_devenv.process import ManagedProcess, free_ports

RESULTS = ROOT / "bench" / "results" / "audit.json"
MINE = ("audit_events_per_second_hub",)
WARM_UP_S = 3.0
_encode = msgspec.json.Encoder().encode


def _cpu_seconds(pid: int, with_children: bool) -> float:
    """CPU seconds (user + system) of ``pid``; ``with_children``: plus every descendant's, live or reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if with_children else []
    except OSError:  # gone meanwhile: its time is in its parent's reaped children
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if with_children else 0)
    return ticks / os.sysconf("SC_CLK_TCK") + sum(_cpu_seconds(int(child), True) for child in children)


def _batch(size: int, sender: int) -> bytes:
    now = time.time()
    identity = ClusterIdentity(kind="impersonate", user="alice", groups=["developers", "gitlab:project_role:40"])
    events = [
        AuditEvent(
            id=uuid.uuid4().hex,
            time=now,
            kind="kubernetes_api",
            agent_id=1 + i % 20,
            kas_instance=f"kas-{sender}",
            verb="get",
            status=200,
            duration_ms=2.4,
            bytes_out=1480,
            user_id=7,
            username="alice",
            token_id=12,
            token_kind="personal_access",
            cluster_identity=identity,
            api_version="v1",
            resource="pods",
            namespace=f"team-{i % 50}",
            name=f"web-{i}",
            path=f"/api/v1/namespaces/team-{i % 50}/pods/web-{i}",
            request_id=uuid.uuid4().hex[:16],
            source_address="10.0.0.7:51234",
        )
        for i in range(size)
    ]
    return _encode({"events": events})


async def _sender(
    url: str, secret: bytes, pool: list[bytes], size: int, sender: int, until: float, counts: dict[str, int]
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while time.monotonic() < until:
            body = pool.pop() if pool else _batch(size, sender)
            headers = {"Gitlab-Kas-Api-Request": mint(secret, ISSUER_KAS, AUDIENCE_GITLAB, 30.0)}
            headers["Content-Type"] = "application/json"
            answer = await client.post("/api/v4/internal/kubernetes/audit_events", content=body, headers=headers)
            answer.raise_for_status()
            result = answer.json()
            counts["accepted"] += result["accepted"]
            counts["duplicates"] += result["duplicates"]


async def _load(url: str, secret: bytes, pool: list[bytes], args: argparse.Namespace) -> tuple[int, float, int]:
    """(events stored while measured, seconds measured, events stored in all)."""
    counts = {"accepted": 0, "duplicates": 0}
    warm_until = time.monotonic() + WARM_UP_S
    senders = range(args.senders)
    await asyncio.gather(*(_sender(url, secret, pool, args.batch, s, warm_until, counts) for s in senders))
    before = counts["accepted"]
    started = time.monotonic()
    until = started + args.seconds
    await asyncio.gather(*(_sender(url, secret, pool, args.batch, s, until, counts) for s in senders))
    elapsed = time.monotonic() - started
    assert counts["duplicates"] == 0, counts
    return counts["accepted"] - before, elapsed, counts["accepted"]


def run(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    """Run the scenario once; the figure as ``{metric, value, unit, ...}``."""
    postgres = PostgresServer(directory / "postgres")
    postgres.start()
    hub: ManagedProcess | None = None
    try:
        name = f"bench_{uuid.uuid4().hex[:8]}"
        postgres.create_database(name)
        database_url = postgres.sqlalchemy_url_for(name)
        (port,) = free_ports(1)
        secret = os.urandom(32)
        secret_file = directory / "gitlab_secret"
        secret_file.write_text(base64.b64encode(secret).decode())
        settings = {
            "listen": f"127.0.0.1:{port}",
            "data_dir": str(directory / "hub"),
            "database": {"url": database_url},
            "gitlab": {"authentication_secret_file": str(secret_file)},
            "logging": {"level": "warn"},
        }
        config = directory / "hub.yaml"
        config.write_text(yaml.safe_dump(settings))
        hub = ManagedProcess("hub", [TETHER, "hub", "--config", str(config), "serve"], directory / "hub.log")
        hub.start()
        batches = int(8000 * (args.seconds + WARM_UP_S) / args.batch) + 1
        pool = [_batch(args.batch, i % args.senders) for i in range(batches)]
        url = f"http://127.0.0.1:{port}"
        hub.wait_ready(lambda: httpx.get(f"{url}/-/health").status_code == 200, 90, "ready")
        load_before = os.getloadavg()
        cpu_before = (_cpu_seconds(hub.pid, False), _cpu_seconds(postgres.pid, True))
        stored, elapsed, total = asyncio.run(_load(url, secret, pool, args))
        cpu_after = (_cpu_seconds(hub.pid, False), _cpu_seconds(postgres.pid, True))
        load_after = os.getloadavg()
        in_table = asyncio.run(rows(database_url, "SELECT count(*) FROM audit_events"))[0][0]
        assert in_table == total, f"the table holds {in_table} events, the hub accepted {total}"
        return [
            {
                "metric": MINE[0],
                "value": round(stored / elapsed),
                "unit": "events/s",
                "target": ">= 5000",
                "events": stored,
                "seconds": round(elapsed, 1),
                "senders": args.senders,
                "batch": args.batch,
                "database": "postgresql",
                "hub_cpu_us_per_event": round((cpu_after[0] - cpu_before[0]) / total * 1e6, 1),
                "postgres_cpu_us_per_event": round((cpu_after[1] - cpu_before[1]) / total * 1e6, 1),
                "load": f"{', '.join(f'{x:.2f}' for x in load_before)} before, "
                f"{', '.join(f'{x:.2f}' for x in load_after)} after",
            }
        ]
    finally:
        if hub is not None:
            hub.stop()
        postgres.stop()


def main() -> None:
    """Parse the options, run, and record the figure in ``bench/results/audit.json`` (others' entries kept)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of measured load")
    parser.add_argument("--senders", type=int, default=2, help="concurrent senders (kas instances)")
    parser.add_argument("--batch", type=int, default=500, help="events per batch")
    parser.add_argument("--runs", type=int, default=1, help="runs, each on a fresh database; the median is kept")
    parser.add_argument("--no-record", action="store_true", help="print only; leave bench/results alone")
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="tether-audit-bench-") as directory:
            results.append(run(args, Path(directory))[0])
        print(json.dumps(results[-1]), flush=True)
    results.sort(key=lambda figure: figure["value"])
    median = dict(results[len(results) // 2])
    if args.runs > 1:
        median |= {"runs": args.runs, "values": [figure["value"] for figure in results]}
    figures = [median]
    print(json.dumps(figures, indent=2))
    if not args.no_record:
        kept = (
            [entry for entry in json.loads(RESULTS.read_text()) if entry["metric"] not in MINE]
            if RESULTS.exists()
            else []
        )
        RESULTS.write_text(json.dumps(kept + figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
