"""Audit at kas (issue 25 item 1): what recording an event adds to a small GET through kas.

Usage: ``uv run python bench/audit_kas.py [--gets 2000]``

Real processes on loopback, set up as ``bench/k8s_proxy.py`` does: a private cluster, redis-server, the hub, and
agentk connected to a gateway kas; two routing kas in front of it, one with ``audit.enabled: true`` (events
queued, shipped to the hub in batches) and one with ``audit.enabled: false``. The same small GET
(``/api/v1/namespaces/default``) goes through each alternately, request by request, so both see the same load;
``audit_small_get_added_ms`` is the median through the auditing kas minus the median through the other
(``audit_small_get_paired_ms``: the median of the per-pair differences, steadier on a loaded machine). Then,
in this process, ``audit_hook_cpu_us``: the CPU a request's audit bookkeeping costs on its own path (record,
RequestInfo, identity, event, queue), timed over many requests. Updates these metrics in
``bench/results/audit.json`` (other metrics there are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import RunningHub
from tests.fixtures.system import System, write_private_secret
from tether_devenv import pki
from tether_devenv.cluster import LocalCluster
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "audit.json"
AGENT_ID = 651
WARM_UP = 50


async def alternate_gets(urls: list[str], token: str, ca: Path, count: int) -> list[list[float]]:
    """``count`` GETs through each URL, alternating; milliseconds per request, per URL (warm-up dropped)."""
    context = ssl.create_default_context(cafile=str(ca))
    samples: list[list[float]] = [[] for _ in urls]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        for index in range(count + WARM_UP):
            order = range(len(urls)) if index % 2 else reversed(range(len(urls)))
            for slot in order:
                url = urls[slot]
                began = time.perf_counter()
                async with session.get(url + "api/v1/namespaces/default", ssl=context) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
                if index >= WARM_UP:
                    samples[slot].append((time.perf_counter() - began) * 1000)
    return samples


async def hook_cpu_us(rounds: int = 20_000) -> float:
    """Microseconds of one request's audit bookkeeping in kas (what a relay does, queue append included)."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from tether.modserver.gitlab_client import GitlabClient, ProxyUserAuthorization  # noqa: PLC0415
    from tether.modules.audit.server.auditor import Auditor  # noqa: PLC0415
    from tether.modules.audit.server.config import AuditCF  # noqa: PLC0415
    from tether.modules.kubernetes_api.server.audit import (  # noqa: PLC0415
        audit_credentials,
        audit_identity,
        audit_target,
    )

    with tempfile.TemporaryDirectory(prefix="tether-bench-audit-hook-") as spool:
        config = AuditCF(spool_dir=Path(spool), queue_max_events=rounds + 1)
        auditor = Auditor(config, GitlabClient("http://127.0.0.1:9", b"k" * 32), "grpc://kas:8155", CollectorRegistry())
        auth = ProxyUserAuthorization(1, 1, 7, "user", False)
        query: dict[str, str] = {}
        began = time.process_time()
        for n in range(rounds):
            record = auditor.begin("kubernetes_api", "GET", "/k8s-proxy/api/v1/namespaces/default", str(n), "::1")
            audit_target(record, "GET", "/api/v1/namespaces/default", query)
            audit_credentials(record, 651, "personal_access_token")
            audit_identity(record, auth, None)
            record.finish(200)
        return (time.process_time() - began) / rounds * 1e6


def paired(on: list[float], off: list[float]) -> float:
    return statistics.median(a - b for a, b in zip(on, off, strict=True))


def shipped(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('tether_kas_audit_events_total{outcome="shipped"}'):
            return float(line.split()[-1])
    return 0.0


async def run(gets: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-audit-") as tmp:
        directory = Path(tmp)
        cluster = LocalCluster(directory / "cluster")
        info = cluster.start()
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(directory / "hub")
        hub = running.hub
        private = write_private_secret(directory / "private_secret")
        tls = pki.generate(directory / "proxy-tls")
        system = System(directory, hub, private, info.kubeconfig, redis, tls)
        try:
            on = system.kas(audit={"enabled": True, "flush_interval": "1s"})
            off = system.kas(audit={"enabled": False})
            gateway = system.kas()
            token, pat = "bench-audit-agent", "bench-audit-pat"
            hub.add_agent(token, AGENT_ID, 1)
            hub.grant_proxy_access(pat, "bench", AGENT_ID, 1)
            system.agentk(token, gateway)
            while gateway.private_url not in await system.tunnel_urls(AGENT_ID):
                await asyncio.sleep(0.1)
            audited, plain = await alternate_gets(
                [on.k8s_proxy_url, off.k8s_proxy_url], f"pat:{AGENT_ID}:{pat}", tls.ca_cert, gets
            )
            await asyncio.sleep(2)  # the last batch
            events = shipped(on.metrics())
        finally:
            system.stop_all()
            running.stop()
            redis.stop()
            cluster.stop()
    added = statistics.median(audited) - statistics.median(plain)
    pair = paired(audited, plain)
    hook = await hook_cpu_us()
    print(f"per-pair median difference {pair:.3f} ms; audit bookkeeping in process {hook:.1f} us CPU per request")
    print(
        f"small GET median over {gets}: audit on {statistics.median(audited):.3f} ms, off "
        f"{statistics.median(plain):.3f} ms, added {added:.3f} ms; {events:.0f} events shipped"
    )
    return [
        {"metric": "audit_small_get_added_ms", "value": round(added, 3), "unit": "ms"},
        {"metric": "audit_small_get_paired_ms", "value": round(pair, 3), "unit": "ms"},
        {"metric": "audit_hook_cpu_us", "value": round(hook, 1), "unit": "us"},
        {"metric": "audit_small_get_on_ms", "value": round(statistics.median(audited), 3), "unit": "ms"},
        {"metric": "audit_small_get_off_ms", "value": round(statistics.median(plain), 3), "unit": "ms"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=2000)
    args = parser.parse_args()
    mine = asyncio.run(run(args.gets))
    names = {entry["metric"] for entry in mine}
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([e for e in kept if e["metric"] not in names] + mine, indent=2) + "\n")


if __name__ == "__main__":
    main()
