"""Tether beside upstream GitLab kas/agentk 16.5 in one run (issue 11): the Kubernetes API proxy and idle memory.

Usage: ``uv run python bench/interop.py [--pods 5000] [--runs 5] [--gets 300]``

Real processes on loopback: a private cluster, redis-server, the real hub (with its Gitaly-compatible service),
and two agent paths side by side, each with its own agent registered in the hub:

- **tether:** ``tether kas`` + ``tether agentk``;
- **upstream:** upstream kas + upstream agentk, built from ``../shared/upstream``.

kubectl uses ``pat:<agent id>:<token>`` against each kas' ``/k8s-proxy/`` (TLS), or the admin kubeconfig for the
direct path; the three paths alternate within each run. Writes ``bench/results/interop.json``:
``kubectl_5000_pods_ratio_{tether,upstream}`` and ``raw_list_5000_pods_ratio_{tether,upstream}`` (each path's
median over direct), ``small_get_added_ms_{tether,upstream}`` (median minus direct median) and
``{kas,agentk}_idle_rss_mib_{tether,upstream}`` (``VmRSS`` with the agent connected and no traffic).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System, write_private_secret
from tests.interop.harness import Interop, answers_200
from tether_devenv import pki, upstream
from tether_devenv.assets import locate
from tether_devenv.cluster import LocalCluster, write_kubeconfig
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "interop.json"
ACCESS = "user_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: platform/clusters\n"


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(locate()["kubectl"]), f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def timed_get_pods(kubeconfig: Path) -> float:
    began = time.perf_counter()
    kubectl(kubeconfig, "get", "pods", "-A", "-o", "json", "--request-timeout=120s")
    return time.perf_counter() - began


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


#: What each path answered to the last timed GET of a URL: Content-Encoding and decoded body bytes. The API
#: server gzips large lists when the client accepts it, so a path that drops ``Accept-Encoding`` skips that cost.
ANSWERS: dict[str, str] = {}


async def timed_requests(url: str, token: str, ca: Path, count: int, warmup: int) -> list[float]:
    """Milliseconds per sequential GET of ``url`` (whole body read), after ``warmup`` unmeasured ones."""
    context = ssl.create_default_context(cafile=str(ca))
    samples = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as session:
        for index in range(count + warmup):
            began = time.perf_counter()
            async with session.get(url, ssl=context) as resp:
                assert resp.status == 200, await resp.text()
                body = await resp.read()
                ANSWERS[url] = f"{resp.headers.get('Content-Encoding', 'identity')}, {len(body):,} bytes decoded"
            if index >= warmup:
                samples.append((time.perf_counter() - began) * 1000)
    return samples


def register_agent(env: Interop, name: str) -> tuple[int, str]:
    admin = env.hub.api()
    agent = admin.post(f"/projects/{env.project_id}/cluster_agents", json={"name": name}).json()
    base = f"/projects/{env.project_id}/cluster_agents/{agent['id']}"
    assert admin.put(f"{base}/configuration", content=ACCESS.encode()).status_code == 200
    token = admin.post(f"{base}/tokens", json={"name": "bench"}).json()["token"]
    return int(agent["id"]), str(token)


async def run(pods: int, runs: int, gets: int) -> list[dict[str, Any]]:
    bins = upstream.locate()
    with tempfile.TemporaryDirectory(prefix="tether-bench-interop-") as tmp:
        directory = Path(tmp)
        cluster = LocalCluster(directory / "cluster")
        info = cluster.start()
        redis = RedisServer(directory / "redis").start()
        tls = pki.generate(directory / "proxy-tls")
        (directory / "hub").mkdir()
        (directory / "system").mkdir()
        launcher = HubLauncher(directory / "hub", f"sqlite+aiosqlite:///{directory / 'hub' / 'hub.db'}")
        hub = launcher.prepare()
        private = write_private_secret(directory / "private_secret")
        system = System(directory / "system", hub, private, info.kubeconfig, redis, tls)  # type: ignore[arg-type]
        env = Interop(directory, bins, launcher, hub, system, redis, tls, info.kubeconfig, locate()["kubectl"])
        try:
            tether_kas = env.tether_kas()
            upstream_kas = env.upstream_kas()
            launcher.start(hub, {"gitaly.listen": f"127.0.0.1:{free_port()}"})
            admin = hub.api()
            group = admin.post("/groups", json={"name": "Platform", "path": "platform"}).json()
            env.project_id = admin.post("/projects", json={"name": "clusters", "namespace_id": group["id"]}).json()[
                "id"
            ]
            user_id, _ = hub.user("bench")
            admin.post(f"/projects/{env.project_id}/members", json={"user_id": user_id, "access_level": 30})
            user_token = hub.token_for(user_id, ("k8s_proxy",))
            tether_id, tether_token = register_agent(env, "tether")
            upstream_id, upstream_token = register_agent(env, "upstream")
            tether_agentk = system.agentk_at(tether_token, tether_kas.agent_address, "tether-agentk")
            env.agent_token = upstream_token
            upstream_agentk = env.upstream_agentk(upstream_kas.agent_address)
            paths = {
                "tether": (tether_kas.k8s_proxy_url, f"pat:{tether_id}:{user_token}"),
                "upstream": (upstream_kas.k8s_proxy_url, f"pat:{upstream_id}:{user_token}"),
            }
            deadline = time.monotonic() + 120
            while not (
                answers_200(f"http://127.0.0.1:{tether_agentk.observability_port}/readiness")
                and upstream_agentk.ready()
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("agents not ready after 120 s")
                await asyncio.sleep(1)
            for url, token in paths.values():  # tunnels up and proxy authorized on both paths
                await timed_requests(url + "api/v1/namespaces/default", token, tls.ca_cert, 1, 0)
            await asyncio.sleep(10)
            assert tether_kas.process is not None
            rss = {
                "kas_idle_rss_mib_tether": rss_mib(tether_kas.process.pid),
                "kas_idle_rss_mib_upstream": rss_mib(upstream_kas.process.pid),
                "agentk_idle_rss_mib_tether": rss_mib(tether_agentk.process.pid),
                "agentk_idle_rss_mib_upstream": rss_mib(upstream_agentk.process.pid),
            }
            print(f"idle RSS (MiB): {rss}", flush=True)

            print(f"creating {pods} pods ...", flush=True)
            kubectl(info.kubeconfig, "create", "namespace", "bench")
            kubectl(
                info.kubeconfig,
                "create",
                "deployment",
                "bench",
                "-n",
                "bench",
                "--image=registry.invalid/x:1",
                f"--replicas={pods}",
            )
            deadline = time.monotonic() + 900
            while True:
                listing = json.loads(
                    kubectl(info.kubeconfig, "get", "--raw", "/api/v1/namespaces/bench/pods?limit=1").stdout
                )
                count = listing["metadata"].get("remainingItemCount", 0) + len(listing["items"])
                if count >= pods:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {count} pods after 900 s")
                await asyncio.sleep(2)

            configs = {"direct": info.kubeconfig}
            for name, (url, token) in paths.items():
                configs[name] = directory / f"{name}.kubeconfig"
                write_kubeconfig(configs[name], url, token, tls.ca_cert, name="kas")
            for config in configs.values():  # warm every path
                await asyncio.to_thread(timed_get_pods, config)
            kubectl_s: dict[str, list[float]] = {name: [] for name in configs}
            raw_ms: dict[str, list[float]] = {name: [] for name in configs}
            endpoints = {
                "direct": (info.server + "/", info.token, info.ca_file),
                **{n: (u, t, tls.ca_cert) for n, (u, t) in paths.items()},
            }
            for _ in range(runs):
                for name, config in configs.items():
                    kubectl_s[name].append(await asyncio.to_thread(timed_get_pods, config))
                for name, (url, token, ca) in endpoints.items():
                    raw_ms[name] += await timed_requests(url + "api/v1/pods", token, ca, 1, 0)
            small = {
                name: await timed_requests(url + "api/v1/namespaces/default", token, ca, gets, 20)
                for name, (url, token, ca) in endpoints.items()
            }
        except BaseException:
            for log in sorted(directory.glob("**/*.log")):
                if "cluster" not in log.parts:
                    print(
                        f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-8:]), file=sys.stderr
                    )
            raise
        finally:
            env.stop()
            launcher.stop_all()
            redis.stop()
            cluster.stop()
    med = {name: statistics.median(values) for name, values in kubectl_s.items()}
    raw = {name: statistics.median(values) for name, values in raw_ms.items()}
    small_med = {name: statistics.median(values) for name, values in small.items()}
    load = os.getloadavg()
    per_run = {k: [round(s, 2) for s in v] for k, v in kubectl_s.items()}
    print(f"kubectl get pods -A -o json ({pods} pods), seconds per run: {per_run}")
    print(f"raw GET /api/v1/pods, ms per run: { {k: [round(s) for s in v] for k, v in raw_ms.items()} }")
    print("answers (Content-Encoding, decoded size):\n" + "\n".join(f"  {u}: {a}" for u, a in ANSWERS.items()))
    print(f"small GET median ms: { {k: round(v, 2) for k, v in small_med.items()} }; load average {load}")
    results: list[dict[str, Any]] = []
    for path in ("tether", "upstream"):
        results += [
            {
                "metric": f"kubectl_5000_pods_ratio_{path}",
                "value": round(med[path] / med["direct"], 3),
                "unit": "ratio",
            },
            {
                "metric": f"raw_list_5000_pods_ratio_{path}",
                "value": round(raw[path] / raw["direct"], 3),
                "unit": "ratio",
            },
            {
                "metric": f"small_get_added_ms_{path}",
                "value": round(small_med[path] - small_med["direct"], 2),
                "unit": "ms",
            },
        ]
    for name, value in rss.items():
        results.append({"metric": name, "value": round(value, 1), "unit": "MiB"})
    results += [
        {"metric": "kubectl_5000_pods_direct_s", "value": round(med["direct"], 3), "unit": "s"},
        {"metric": "raw_list_5000_pods_direct_ms", "value": round(raw["direct"], 1), "unit": "ms"},
        {"metric": "small_get_direct_ms", "value": round(small_med["direct"], 2), "unit": "ms"},
        {"metric": "load_average_1m_at_end", "value": round(load[0], 2), "unit": "load"},
    ]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gets", type=int, default=300)
    args = parser.parse_args()
    results = asyncio.run(run(args.pods, args.runs, args.gets))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
