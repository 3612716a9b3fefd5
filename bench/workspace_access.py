"""Workspace access benchmark (issue 13): a workspace's editor through kas and agentk versus straight to it.

Usage: ``uv run python bench/workspace_access.py [--gets 1000] [--runs 3] [--mib 256]`` (as root: the editor
runs in a network namespace).

Real processes on loopback: a private cluster, redis-server, the real hub, ``tether kas`` with the workspaces
listener and ``tether agentk`` connected to it; the editor stand-in (``tests.support.workspace_editor``) runs in
a network namespace, reached through a Service without selector and an EndpointSlice, as in the end-to-end
tests. The user's path is client -> kas (host form ``60001-<name>.<zone>``, a personal access token) -> tunnel ->
agentk -> the editor; the direct path is client -> the editor. Small GETs alternate between the two paths on
kept-alive connections; the first byte is the response head. Downloads are read as fast as the client can.
Writes ``bench/results/workspace_access.json``: ``first_byte_added_ms`` (p50 via kas minus p50 direct; target
<= 5) and ``download_mb_s`` (median of the runs, MB = 10^6 bytes; target >= 100), plus the figures behind them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import RunningHub
from tests.fixtures.netns import EDITOR_PORT, start_in_netns, stop_netns
from tests.fixtures.system import System, write_private_secret
from tests.support.workspace_access import ZONE, ZoneResolver, seed_workspace, service_manifest, workspaces_section
from tether_devenv.assets import locate
from tether_devenv.cluster import LocalCluster
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "workspace_access.json"
AGENT_ID, PROJECT_ID = 1301, 1301
NAME, NAMESPACE = "bench-ws", "bench-ws"
WARM_UP = 50


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> None:
    result = subprocess.run(
        [str(locate()["kubectl"]), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")


async def first_bytes(via_kas: str, direct: str, token: str, count: int) -> tuple[list[float], list[float]]:
    """Alternating small GETs; milliseconds to the response head of each, (via kas, direct)."""
    kas_ms: list[float] = []
    direct_ms: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(resolver=ZoneResolver())
    async with aiohttp.ClientSession(connector=connector) as session:
        for index in range(count + WARM_UP):
            for url, samples, sent in ((via_kas, kas_ms, headers), (direct, direct_ms, {})):
                began = time.perf_counter()
                async with session.get(url, headers=sent) as response:
                    head = time.perf_counter()
                    assert response.status == 200, await response.text()
                    await response.read()
                if index >= WARM_UP:
                    samples.append((head - began) * 1000)
    return kas_ms, direct_ms


async def download_mb_s(url: str, token: str | None, mib: int) -> float:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(resolver=ZoneResolver())
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        received = 0
        async with session.get(f"{url}/download?mb={mib}", headers=headers) as response:
            assert response.status == 200, await response.text()
            async for chunk in response.content.iter_any():
                received += len(chunk)
        seconds = time.perf_counter() - began
    assert received == mib * 1024 * 1024, received
    return received / seconds / 1e6


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def run(gets: int, runs: int, mib: int) -> list[dict[str, object]]:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the editor runs in a network namespace")
    with tempfile.TemporaryDirectory(prefix="tether-bench-workspaces-") as tmp:
        directory = Path(tmp)
        cluster = LocalCluster(directory / "cluster")
        info = cluster.start()
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(directory / "hub")
        hub = running.hub
        system = System(directory, hub, write_private_secret(directory / "private_secret"), info.kubeconfig, redis)
        editor = start_in_netns("tests.support.workspace_editor", EDITOR_PORT, directory / "editor.out")
        try:
            port = free_port()
            kas = system.kas(workspaces=workspaces_section(port, authorization_cache_ttl="300s"))
            agent_token = "bench-workspace-agent-token"
            hub.add_agent(agent_token, AGENT_ID, PROJECT_ID)
            user_id, token = hub.user("bench", ("read_api",))
            workspace_id = seed_workspace(
                hub, agent_id=AGENT_ID, user_id=user_id, project_id=PROJECT_ID, name=NAME, namespace=NAMESPACE
            )
            kubectl(info.kubeconfig, "create", "namespace", NAMESPACE)
            manifest = service_manifest(
                name=NAME,
                namespace=NAMESPACE,
                agent_id=AGENT_ID,
                workspace_id=workspace_id,
                address=editor.address,
                port=editor.port,
            )
            kubectl(info.kubeconfig, "apply", "-f", "-", stdin=manifest)
            system.agentk(agent_token, kas)
            via_kas = f"http://{EDITOR_PORT}-{NAME}.{ZONE}:{port}"
            deadline = time.monotonic() + 60
            while kas.private_url not in await system.tunnel_urls(AGENT_ID):
                if time.monotonic() > deadline:
                    raise RuntimeError("agentk opened no tunnel in 60 s")
                await asyncio.sleep(0.2)
            kas_ms, direct_ms = await first_bytes(via_kas + "/", editor.url + "/", token, gets)
            await download_mb_s(via_kas, token, 16)  # warm-up
            via_mb_s = [await download_mb_s(via_kas, token, mib) for _ in range(runs)]
            direct_mb_s = [await download_mb_s(editor.url, None, mib) for _ in range(runs)]
        except BaseException:
            for log in sorted(directory.glob("**/*.log")):
                if "cluster" not in log.parts:
                    tail = "\n".join(log.read_text().splitlines()[-8:])
                    print(f"--- {log.name} (last lines)\n{tail}", file=sys.stderr)
            raise
        finally:
            stop_netns(editor)
            system.stop_all()
            running.stop()
            redis.stop()
            cluster.stop()
    added = statistics.median(kas_ms) - statistics.median(direct_ms)
    print(f"small GET, ms to the response head ({gets} each, alternating):")
    print(f"  direct   p50 {statistics.median(direct_ms):.2f}  p99 {percentile(direct_ms, 0.99):.2f}")
    print(f"  via kas  p50 {statistics.median(kas_ms):.2f}  p99 {percentile(kas_ms, 0.99):.2f}")
    print(f"  added    p50 {added:.2f}")
    print(f"download {mib} MiB, MB/s: via kas {[round(x, 1) for x in via_mb_s]}")
    print(f"                      direct  {[round(x, 1) for x in direct_mb_s]}")
    return [
        {"metric": "first_byte_added_ms", "value": round(added, 2), "unit": "ms"},
        {"metric": "download_mb_s", "value": round(statistics.median(via_mb_s), 1), "unit": "MB/s"},
        {"metric": "first_byte_direct_p50_ms", "value": round(statistics.median(direct_ms), 2), "unit": "ms"},
        {"metric": "first_byte_via_kas_p50_ms", "value": round(statistics.median(kas_ms), 2), "unit": "ms"},
        {"metric": "first_byte_via_kas_p99_ms", "value": round(percentile(kas_ms, 0.99), 2), "unit": "ms"},
        {"metric": "download_direct_mb_s", "value": round(statistics.median(direct_mb_s), 1), "unit": "MB/s"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=1000, help="small GETs on each path")
    parser.add_argument("--runs", type=int, default=3, help="downloads on each path (median reported)")
    parser.add_argument("--mib", type=int, default=256, help="size of each download in MiB")
    args = parser.parse_args()
    results = asyncio.run(run(args.gets, args.runs, args.mib))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
