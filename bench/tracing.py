"""What tracing costs a small proxied GET (issue 25 item 3): exporting on over off, in the same run.

Usage: ``uv run python bench/tracing.py [--rounds 7] [--gets 200]``

Real processes on loopback: redis-server, the hub, Jaeger (``tether_devenv.jaeger``) and two identical set-ups,
each of two ``tether kas`` and one ``tether agentk`` connected to the second kas: one with tracing off (the
default), one exporting every span to Jaeger (``sampler_ratio`` 1, the worst case). agentk's cluster is a small
HTTP server answering a namespace object, so the figure is kas' and agentk's own work. Off and on alternate
request by request, so a change of machine load hits both. A GET is client -> kas 1's Kubernetes API proxy
(TLS) -> kas 2 -> tunnel -> agentk -> the server. Adds ``tracing_small_get_added_ms`` (median of the per-round
differences of medians) to ``bench/results/audit.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.test_k8s_proxy_upgrade import agent_kubeconfig
from tests.fixtures.hub import RealHub, RunningHub
from tests.fixtures.system import System, write_private_secret
from tether.tool.tracing import ENDPOINT_ENV
from tether_devenv import pki
from tether_devenv.jaeger import JaegerServer
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "audit.json"
METRIC = "tracing_small_get_added_ms"


async def serve_namespace() -> tuple[web.AppRunner, str]:
    """The agents' API server: every GET answers one small Namespace object."""

    async def namespace(_request: web.Request) -> web.Response:
        return web.json_response({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "default"}})

    app = web.Application()
    app.router.add_get("/{tail:.*}", namespace)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def setup(system: System, hub: RealHub, agent_id: int, server: str, tracing: dict[str, object]) -> str:
    """Two kas and an agentk on the second; returns the routing kas' proxy URL. Waits for the tunnel."""
    kas1, kas2 = system.kas(**tracing), system.kas(**tracing)
    token, pat = f"bench-tracing-agent-{agent_id}", f"bench-tracing-pat-{agent_id}"
    hub.add_agent(token, agent_id, 1)
    hub.grant_proxy_access(pat, "bench", agent_id, 1)
    kubeconfig = agent_kubeconfig(system.directory / f"agent-{agent_id}.kubeconfig", server, "sa-token")
    system.agentk(token, kas2, f"bench-{agent_id}", kubeconfig=kubeconfig)
    deadline = time.monotonic() + 60
    while kas2.private_url not in await system.tunnel_urls(agent_id):
        if time.monotonic() > deadline:
            raise RuntimeError(f"agent {agent_id} did not connect")
        await asyncio.sleep(0.2)
    return f"{kas1.k8s_proxy_url}|pat:{agent_id}:{pat}"


async def _get(session: aiohttp.ClientSession, target: str, context: ssl.SSLContext) -> float:
    url, token = target.split("|")
    began = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    async with session.get(url + "api/v1/namespaces/default", ssl=context, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    return (time.perf_counter() - began) * 1000


async def paired_gets(off: str, on: str, ca: Path, count: int) -> tuple[list[float], list[float]]:
    """``count`` GETs on each set-up, alternating one by one (load changes hit both alike), after 10 warm-ups."""
    context = ssl.create_default_context(cafile=str(ca))
    off_ms, on_ms = [], []
    async with aiohttp.ClientSession() as off_session, aiohttp.ClientSession() as on_session:
        for index in range(count + 10):
            first_off = index % 2 == 0  # alternate which goes first
            if first_off:
                a = await _get(off_session, off, context)
                b = await _get(on_session, on, context)
            else:
                b = await _get(on_session, on, context)
                a = await _get(off_session, off, context)
            if index >= 10:
                off_ms.append(a)
                on_ms.append(b)
    return off_ms, on_ms


def _spans_stored(jaeger: JaegerServer) -> int:
    services = jaeger.get("/api/services").get("data") or []
    return len(services)


async def run(rounds: int, gets: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-tracing-") as tmp:
        directory = Path(tmp)
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(directory / "hub")
        hub = running.hub
        private = write_private_secret(directory / "private_secret")
        tls = pki.generate(directory / "proxy-tls")
        (directory / "jaeger").mkdir()
        jaeger = JaegerServer(directory / "jaeger")
        jaeger.start()
        runner, server = await serve_namespace()
        systems = []
        for name in ("off", "on"):
            (directory / name).mkdir()
            systems.append(System(directory / name, hub, private, None, redis, tls))
        try:
            off = await setup(systems[0], hub, 901, server, {})
            os.environ[ENDPOINT_ENV] = jaeger.otlp_endpoint  # agentk "on" takes it from its environment
            traced = {"observability": {"tracing": {"otlp_endpoint": jaeger.otlp_endpoint}}}
            try:
                on = await setup(systems[1], hub, 902, server, traced)
            finally:
                del os.environ[ENDPOINT_ENV]
            added, off_medians, on_medians, loads = [], [], [], []
            for _ in range(rounds):
                loads.append(os.getloadavg()[0])
                off_samples, on_samples = await paired_gets(off, on, tls.ca_cert, gets)
                off_ms, on_ms = statistics.median(off_samples), statistics.median(on_samples)
                off_medians.append(round(off_ms, 2))
                on_medians.append(round(on_ms, 2))
                added.append(round(on_ms - off_ms, 3))
                print(f"off {off_ms:.2f} ms, on {on_ms:.2f} ms, added {on_ms - off_ms:+.2f} ms", flush=True)
            services = await asyncio.to_thread(_spans_stored, jaeger)
            assert services >= 2, f"Jaeger stored spans of {services} services only: is exporting on?"
        finally:
            for system in systems:
                system.stop_all()
            await runner.cleanup()
            jaeger.stop()
            running.stop()
            redis.stop()
    value = statistics.median(added)
    print(f"{METRIC}: {value:.2f} ms (per round {added})")
    return {
        "metric": METRIC,
        "value": round(value, 2),
        "unit": "ms",
        "runs": added,
        "off_median_ms": off_medians,
        "on_median_ms": on_medians,
        "gets_per_round": gets,
        "load_average_1m": [round(x, 1) for x in loads],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gets", type=int, default=200)
    args = parser.parse_args()
    result = asyncio.run(run(args.rounds, args.gets))
    # A file shared with the audit benchmarks: only this metric's entry is replaced.
    entries = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    entries = [e for e in entries if e.get("metric") != METRIC] + [result]
    RESULTS.write_text(json.dumps(entries, indent=2) + "\n")


if __name__ == "__main__":
    main()
