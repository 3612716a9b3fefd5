"""Kubernetes API proxy benchmark (issue 5): kubectl through kas versus straight to the API server.

Usage: ``uv run python bench/k8s_proxy.py [--pods 5000] [--runs 5] [--gets 300]``

Real processes on loopback: a private cluster (etcd, kube-apiserver, controller manager, scheduler, kwok),
redis-server, two ``tether kas`` processes and ``tether agentk`` connected to kas 2 only. The proxied path
is kubectl -> kas 1 (TLS, ``/k8s-proxy/``) -> kas 2 -> tunnel -> agentk -> kube-apiserver. Writes
``bench/results/k8s_proxy.json`` (``kubectl_5000_pods_ratio``, ``small_get_added_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import RunningHub
from tests.fixtures.system import System, write_private_secret
from tether_devenv import pki
from tether_devenv.assets import locate
from tether_devenv.cluster import LocalCluster, write_kubeconfig
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "k8s_proxy.json"
AGENT_ID = 601


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(locate()["kubectl"]), f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


async def create_pods(kubeconfig: Path, pods: int, limit_s: float) -> None:
    """A Deployment of ``pods`` never-running pods in namespace ``bench``; returns once the API lists them all.

    Raises:
        RuntimeError: fewer than ``pods`` are listed after ``limit_s`` seconds, or kubectl failed.
    """
    print(f"creating {pods} pods ...", flush=True)
    kubectl(kubeconfig, "create", "namespace", "bench")
    image = "--image=registry.invalid/x:1"
    kubectl(kubeconfig, "create", "deployment", "bench", "-n", "bench", image, f"--replicas={pods}")
    deadline = time.monotonic() + limit_s
    while True:
        listing = json.loads(kubectl(kubeconfig, "get", "--raw", "/api/v1/namespaces/bench/pods?limit=1").stdout)
        count = listing["metadata"].get("remainingItemCount", 0) + len(listing["items"])
        if count >= pods:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {count} pods after {limit_s:g} s")
        await asyncio.sleep(2)


def timed_get_pods(kubeconfig: Path) -> tuple[float, int]:
    began = time.perf_counter()
    out = kubectl(kubeconfig, "get", "pods", "-A", "-o", "json", "--request-timeout=120s").stdout
    return time.perf_counter() - began, len(out)


async def small_gets(url: str, token: str, ca: Path, count: int) -> list[float]:
    context = ssl.create_default_context(cafile=str(ca))
    samples = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        for index in range(count + 20):
            began = time.perf_counter()
            async with session.get(url + "api/v1/namespaces/default", ssl=context) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            if index >= 20:  # warm-up
                samples.append((time.perf_counter() - began) * 1000)
    return samples


async def run(pods: int, runs: int, gets: int) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-proxy-") as tmp:
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
            kas1, kas2 = system.kas(), system.kas()
            token, pat = "bench-proxy-agent", "bench-proxy-pat"
            hub.add_agent(token, AGENT_ID, 1)
            hub.grant_proxy_access(pat, "bench", AGENT_ID, 1)
            system.agentk(token, kas2)
            await create_pods(info.kubeconfig, pods, limit_s=600)
            proxied = directory / "proxied.kubeconfig"
            write_kubeconfig(proxied, kas1.k8s_proxy_url, f"pat:{AGENT_ID}:{pat}", tls.ca_cert, name="kas")
            await asyncio.to_thread(timed_get_pods, proxied)  # warm both paths (tunnel pool, caches)
            direct_s, proxied_s, sizes = [], [], set()
            for _ in range(runs):
                seconds, size = await asyncio.to_thread(timed_get_pods, info.kubeconfig)
                direct_s.append(seconds)
                sizes.add(size)
                seconds, size = await asyncio.to_thread(timed_get_pods, proxied)
                proxied_s.append(seconds)
                sizes.add(size)
            direct_ms = await small_gets(info.server + "/", info.token, info.ca_file, gets)
            proxy_ms = await small_gets(kas1.k8s_proxy_url, f"pat:{AGENT_ID}:{pat}", tls.ca_cert, gets)
        except BaseException:
            for log in sorted(directory.glob("**/*.log")):
                if "cluster" not in log.parts:
                    print(
                        f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-8:]), file=sys.stderr
                    )
            raise
        finally:
            system.stop_all()
            running.stop()
            redis.stop()
            cluster.stop()
    ratio = statistics.median(proxied_s) / statistics.median(direct_s)
    added = statistics.median(proxy_ms) - statistics.median(direct_ms)
    print(f"kubectl get pods -A -o json ({pods} pods, ~{max(sizes) / 1e6:.1f} MB):")
    print(f"  direct   {[round(s, 2) for s in direct_s]} s, median {statistics.median(direct_s):.2f} s")
    print(f"  via kas  {[round(s, 2) for s in proxied_s]} s, median {statistics.median(proxied_s):.2f} s")
    print(f"  ratio    {ratio:.2f}")
    print(
        f"small GET median: direct {statistics.median(direct_ms):.2f} ms, via kas {statistics.median(proxy_ms):.2f} ms,"
        f" added {added:.2f} ms (p99 via kas {sorted(proxy_ms)[int(len(proxy_ms) * 0.99) - 1]:.2f} ms)"
    )
    return [
        {"metric": "kubectl_5000_pods_ratio", "value": round(ratio, 3), "unit": "ratio"},
        {"metric": "small_get_added_ms", "value": round(added, 2), "unit": "ms"},
        {"metric": "kubectl_5000_pods_direct_s", "value": round(statistics.median(direct_s), 3), "unit": "s"},
        {"metric": "kubectl_5000_pods_via_kas_s", "value": round(statistics.median(proxied_s), 3), "unit": "s"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gets", type=int, default=300)
    args = parser.parse_args()
    results = asyncio.run(run(args.pods, args.runs, args.gets))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
