"""Tether beside upstream GitLab kas/agentk 16.5 in one run (issue 11): the Kubernetes API proxy and idle memory.

Usage: ``uv run python bench/interop.py [--pods 5000] [--runs 5] [--gets 300] [--watch-events 100]
[--baseline NAME=DIR ...] [--mixed] [--profile DIR] [--output FILE]``

Real processes on loopback: a private cluster, redis-server, the real hub (with its Gitaly-compatible service),
and two agent paths side by side, each with its own agent registered in the hub:

- **tether:** ``tether kas`` + ``tether agentk``;
- **upstream:** upstream kas + upstream agentk, built from ``../shared/upstream``;
- **NAME** (each ``--baseline NAME=DIR``): ``tether kas`` + ``tether agentk`` run from another source tree (e.g. an
  export of ``main``), so a change and its before are measured in the same run, interleaved (issue 28); small
  requests and watch events only;
- **with ``--mixed``:** ``tether-kas+upstream-agentk`` and ``upstream-kas+tether-agentk``, each with an agent of its
  own, so that a difference between the two products can be put on the kas or the agentk side (small requests
  and watch events only).

kubectl uses ``pat:<agent id>:<token>`` against each kas' ``/k8s-proxy/`` (TLS), or the admin kubeconfig for the
direct path; the three paths alternate within each run. Writes ``bench/results/interop.json``:
``kubectl_5000_pods_ratio_{tether,upstream}`` and ``raw_list_5000_pods_ratio_{tether,upstream}`` (each path's
median over direct), ``small_get_added_ms_{tether,upstream}`` (median minus direct median) and
``{kas,agentk}_idle_rss_mib_{tether,upstream}`` (``VmRSS`` with the agent connected and no traffic),
``small_watch_event_added_ms_{tether,upstream}`` (a ConfigMap change reaching a watch through the path, median of
the per-event delay behind a direct watch that sees the same event; the path's watch open beside the direct one
only, in rounds of ten events per path, alternating) and ``small_watch_event_added_concurrent_ms_*`` (the same with
every path's watch open at once: each event is relayed by all paths at the same moment, which then compete for the
cores; issue 28's figure until 2026-11-27). The small GETs go in rounds of ten per path, alternating, so load from
other processes falls on every path alike. ``--pods 0`` skips the list figures.
``--profile DIR`` samples Tether kas and agentk with py-spy during 2,000 more small GETs (raw collapsed stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.k8s_proxy import create_pods, kubectl
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


class Getter:
    """Sequential GETs of one URL on one keep-alive session (one path of the small-request figure)."""

    def __init__(self, stack: AsyncExitStack, url: str, token: str, ca: Path) -> None:
        self.url = url
        self.context = ssl.create_default_context(cafile=str(ca))
        self.token = token
        self.stack = stack
        self.session: aiohttp.ClientSession | None = None
        self.samples: list[float] = []

    async def get(self, count: int, record: bool = True) -> None:
        """Time ``count`` GETs in milliseconds (whole body read); keep them when ``record``."""
        if self.session is None:
            self.session = await self.stack.enter_async_context(
                aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"})
            )
        for _ in range(count):
            began = time.perf_counter()
            async with self.session.get(self.url, ssl=self.context) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            if record:
                self.samples.append((time.perf_counter() - began) * 1000)


async def interleaved_gets(getters: dict[str, Getter], gets: int, warmup: int) -> dict[str, float]:
    """Median milliseconds per path: ``warmup`` unmeasured GETs each, then rounds of ten per path in turn."""
    for getter in getters.values():
        await getter.get(warmup, record=False)
    for _ in range(max(1, gets // 10)):
        for getter in getters.values():
            await getter.get(10)
    return {name: statistics.median(getter.samples) for name, getter in getters.items()}


WATCHED = "bench-watch"


async def _timed_events(
    admin: aiohttp.ClientSession,
    target: str,
    context: ssl.SSLContext,
    watched: dict[str, tuple[str, str, Path]],
    indices: range,
) -> dict[str, dict[int, float]]:
    """Open a watch per ``watched`` path, make one ConfigMap change per index, return when each watch saw it."""
    seen: dict[str, dict[int, float]] = {name: {} for name in watched}
    opened: dict[str, bool] = {name: False for name in watched}
    arrived = asyncio.Event()
    query = f"api/v1/namespaces/default/configmaps?watch=1&fieldSelector=metadata.name%3D{WATCHED}"

    async def watch(name: str, url: str, token: str, ca: Path) -> None:
        watch_context = ssl.create_default_context(cafile=str(ca))
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as session,
            session.get(url + query, ssl=watch_context) as resp,
        ):
            assert resp.status == 200, await resp.text()
            async for line in resp.content:
                stamp = time.perf_counter()
                if line.strip():
                    counter = json.loads(line)["object"].get("data", {}).get("n")
                    if opened[name] and counter is not None:
                        seen[name][int(counter)] = stamp
                    opened[name] = True  # the first event is the ConfigMap's state when the watch opened
                    arrived.set()

    async def until(done: Callable[[], bool], what: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} after {limit_s:.0f} s")
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), 1)

    tasks = [asyncio.create_task(watch(name, *endpoint)) for name, endpoint in watched.items()]
    try:
        await until(lambda: all(opened.values()), f"watches not open: {opened}", 30)
        for index in indices:
            patch = json.dumps({"data": {"n": str(index)}})
            headers = {"Content-Type": "application/merge-patch+json"}
            async with admin.patch(f"{target}/{WATCHED}", data=patch, headers=headers, ssl=context) as resp:
                assert resp.status == 200, await resp.text()
            await until(
                lambda i=index: all(i in got for got in seen.values()), f"event {index} missing on some watch", 10
            )
            await asyncio.sleep(0.02)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return seen


async def watch_added_ms(
    endpoints: dict[str, tuple[str, str, Path]], events: int, *, together: bool
) -> dict[str, float]:
    """Median delay (ms) of each path's watch behind a direct watch of the same event, over ``events`` changes.

    The direct path writes a counter into the watched ConfigMap; each watch stamps when its event line arrives.
    ``together``: every path's watch is open at once, so all paths relay each event at the same moment and
    compete for the cores. Otherwise a path's watch is open only beside the direct one, in rounds of ten events per
    path, alternating (as the small GETs: a user's event does not wait for other proxies' work).
    """
    url, token, ca = endpoints["direct"]
    context = ssl.create_default_context(cafile=str(ca))
    paths = [name for name in endpoints if name != "direct"]
    delays: dict[str, list[float]] = {name: [] for name in endpoints}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as admin:
        target = f"{url}api/v1/namespaces/default/configmaps"
        body = {"metadata": {"name": WATCHED}, "data": {"n": "-1"}}
        async with admin.post(target, json=body, ssl=context) as resp:
            assert resp.status in (201, 409), await resp.text()
        if together:
            rounds = [(list(endpoints), range(events))]
        else:
            per_round = 10
            rounds = []
            for first in range(0, events, per_round):
                for number, name in enumerate(paths):
                    # Values the together-phase did not write: a change to the same value would bring no event.
                    start = 1_000_000 + first * len(paths) + number * per_round
                    rounds.append((["direct", name], range(start, start + min(per_round, events - first))))
        for names, indices in rounds:
            seen = await _timed_events(admin, target, context, {n: endpoints[n] for n in names}, indices)
            for name in names:
                delays[name] += [(seen[name][i] - seen["direct"][i]) * 1000 for i in indices]
    return {name: statistics.median(values) for name, values in delays.items()}


@contextmanager
def python_path(src: Path | None) -> Iterator[None]:
    """Processes started inside run ``tether`` from ``src`` (the baseline tree) instead of this one."""
    if src is None:
        yield
        return
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{src / 'src'}:{src}"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def profile(pids: dict[str, int], directory: Path, seconds: int) -> list[subprocess.Popen[bytes]]:
    """Start py-spy (1,000 samples/s, raw collapsed stacks, idle frames dropped) on each named process."""
    directory.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    options = ["-r", "1000", "-d", str(seconds), "-f", "raw", "--nonblocking"]
    return [
        subprocess.Popen(
            [spy, "record", "-p", str(pid), *options, "-o", str(directory / f"{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


async def trace_hops(pids: dict[str, int], directory: Path, getter: Getter) -> None:
    """Per-hop timestamps: strace's socket reads and writes of kas and agentk during 5 GETs 0.3 s apart.

    Writes ``<name>.strace`` (``-ttt -f``: thread, wall time, call) and ``sockets.txt`` (``ss -tanpx``: which
    file descriptor of which process talks to which port), read together to label each hop.
    """
    calls = "trace=read,write,readv,writev,recvfrom,sendto,recvmsg,sendmsg"
    tracers = [
        subprocess.Popen(
            ["strace", "-f", "-ttt", "-e", calls, "-s", "0", "-o", str(directory / f"{name}.strace"), "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    await asyncio.sleep(2)
    for _ in range(5):
        await getter.get(1)
        await asyncio.sleep(0.3)
    listing = await asyncio.to_thread(subprocess.run, ["ss", "-tanpx"], capture_output=True, text=True, check=False)
    sockets = listing.stdout
    (directory / "sockets.txt").write_text(sockets)
    for tracer in tracers:
        tracer.send_signal(2)
        tracer.wait(30)
    print(f"traced 5 GETs (ms): {[round(x, 2) for x in getter.samples[-5:]]}", flush=True)


def register_agent(env: Interop, name: str) -> tuple[int, str]:
    admin = env.hub.api()
    agent = admin.post(f"/projects/{env.project_id}/cluster_agents", json={"name": name}).json()
    base = f"/projects/{env.project_id}/cluster_agents/{agent['id']}"
    assert admin.put(f"{base}/configuration", content=ACCESS.encode()).status_code == 200
    token = admin.post(f"{base}/tokens", json={"name": "bench"}).json()["token"]
    return int(agent["id"]), str(token)


async def run(
    pods: int,
    runs: int,
    gets: int,
    watch_events: int,
    baselines: dict[str, Path],
    profile_dir: Path | None,
    mixed: bool = False,
) -> list[dict[str, Any]]:
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
        systems = {}
        for name in baselines:
            (directory / f"system-{name}").mkdir()
            systems[name] = System(directory / f"system-{name}", hub, private, info.kubeconfig, redis, tls)  # type: ignore[arg-type]
        env = Interop(directory, bins, launcher, hub, system, redis, tls, info.kubeconfig, locate()["kubectl"])
        try:
            tether_kas = env.tether_kas()
            upstream_kas = env.upstream_kas()
            base_kas = {}
            for name, src in baselines.items():
                with python_path(src):
                    base_kas[name] = systems[name].kas()
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
            tether_agentks = [tether_agentk]
            upstream_agentks = [upstream_agentk]
            if mixed:
                mixed_id, env.agent_token = register_agent(env, "mixed-upstream-agentk")
                upstream_agentks.append(env.upstream_agentk(tether_kas.agent_address, "mixed-upstream-agentk"))
                paths["tether-kas+upstream-agentk"] = (tether_kas.k8s_proxy_url, f"pat:{mixed_id}:{user_token}")
                mixed_id, mixed_token = register_agent(env, "mixed-tether-agentk")
                tether_agentks.append(system.agentk_at(mixed_token, upstream_kas.agent_address, "mixed-tether-agentk"))
                paths["upstream-kas+tether-agentk"] = (upstream_kas.k8s_proxy_url, f"pat:{mixed_id}:{user_token}")
            for name, src in baselines.items():
                base_id, base_token = register_agent(env, name)
                with python_path(src):
                    agentk = systems[name].agentk_at(base_token, base_kas[name].agent_address, f"{name}-agentk")
                tether_agentks.append(agentk)
                paths[name] = (base_kas[name].k8s_proxy_url, f"pat:{base_id}:{user_token}")
            deadline = time.monotonic() + 120
            while not (
                all(answers_200(f"http://127.0.0.1:{a.observability_port}/readiness") for a in tether_agentks)
                and all(a.ready() for a in upstream_agentks)
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

            endpoints = {
                "direct": (info.server + "/", info.token, info.ca_file),
                **{n: (u, t, tls.ca_cert) for n, (u, t) in paths.items()},
            }
            kubectl_s: dict[str, list[float]] = {}
            raw_ms: dict[str, list[float]] = {}
            if pods:
                await create_pods(info.kubeconfig, pods, limit_s=900)

                configs = {"direct": info.kubeconfig}
                for name in ("tether", "upstream"):
                    url, token = paths[name]
                    configs[name] = directory / f"{name}.kubeconfig"
                    write_kubeconfig(configs[name], url, token, tls.ca_cert, name="kas")
                for config in configs.values():  # warm every path
                    await asyncio.to_thread(timed_get_pods, config)
                kubectl_s.update({name: [] for name in configs})
                raw_ms.update({name: [] for name in configs})
                for _ in range(runs):
                    for name, config in configs.items():
                        kubectl_s[name].append(await asyncio.to_thread(timed_get_pods, config))
                    for name in configs:
                        url, token, ca = endpoints[name]
                        raw_ms[name] += await timed_requests(url + "api/v1/pods", token, ca, 1, 0)
            async with AsyncExitStack() as stack:
                getters = {
                    name: Getter(stack, url + "api/v1/namespaces/default", token, ca)
                    for name, (url, token, ca) in endpoints.items()
                }
                small_med = await interleaved_gets(getters, gets, 20)
                samples = {name: getter.samples for name, getter in getters.items()}
                if profile_dir is not None:
                    assert tether_kas.process is not None
                    pids = {"kas": tether_kas.process.pid, "agentk": tether_agentk.process.pid}
                    spies = profile(pids, profile_dir, 60)
                    await asyncio.sleep(2)
                    began = time.perf_counter()
                    await getters["tether"].get(2000, record=False)
                    print(f"profiled 2,000 GETs in {time.perf_counter() - began:.1f} s", flush=True)
                    for spy in spies:
                        spy.send_signal(2)
                        spy.wait(60)
                    await trace_hops(pids, profile_dir, getters["tether"])
            watch_together = await watch_added_ms(endpoints, watch_events, together=True)
            watch_added = await watch_added_ms(endpoints, watch_events, together=False)
        except BaseException:
            for log in sorted(directory.glob("**/*.log")):
                if "cluster" not in log.parts:
                    print(
                        f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-8:]), file=sys.stderr
                    )
            raise
        finally:
            for other in systems.values():
                other.stop_all()
            env.stop()
            launcher.stop_all()
            redis.stop()
            cluster.stop()
    med = {name: statistics.median(values) for name, values in kubectl_s.items()}
    raw = {name: statistics.median(values) for name, values in raw_ms.items()}
    load = os.getloadavg()
    per_run = {k: [round(s, 2) for s in v] for k, v in kubectl_s.items()}
    print(f"kubectl get pods -A -o json ({pods} pods), seconds per run: {per_run}")
    print(f"raw GET /api/v1/pods, ms per run: { {k: [round(s) for s in v] for k, v in raw_ms.items()} }")
    print("answers (Content-Encoding, decoded size):\n" + "\n".join(f"  {u}: {a}" for u, a in ANSWERS.items()))
    print(f"small GET median ms: { {k: round(v, 2) for k, v in small_med.items()} }; load average {load}")
    p90 = {k: round(statistics.quantiles(v, n=10)[-1], 2) for k, v in samples.items()}
    print(f"small GET p90 ms: {p90}")
    print(f"small watch event added ms, one path at a time: { {k: round(v, 2) for k, v in watch_added.items()} }")
    print(f"small watch event added ms, every path at once: { {k: round(v, 2) for k, v in watch_together.items()} }")
    results: list[dict[str, Any]] = []
    for path in paths:
        results += [
            {
                "metric": f"small_get_added_ms_{path}",
                "value": round(small_med[path] - small_med["direct"], 2),
                "unit": "ms",
            },
            {"metric": f"small_watch_event_added_ms_{path}", "value": round(watch_added[path], 2), "unit": "ms"},
            {
                "metric": f"small_watch_event_added_concurrent_ms_{path}",
                "value": round(watch_together[path], 2),
                "unit": "ms",
            },
        ]
    for path in ("tether", "upstream") if pods else ():
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
        ]
    for name, value in rss.items():
        results.append({"metric": name, "value": round(value, 1), "unit": "MiB"})
    if pods:
        results += [
            {"metric": "kubectl_5000_pods_direct_s", "value": round(med["direct"], 3), "unit": "s"},
            {"metric": "raw_list_5000_pods_direct_ms", "value": round(raw["direct"], 1), "unit": "ms"},
        ]
    results += [
        {"metric": "small_get_direct_ms", "value": round(small_med["direct"], 2), "unit": "ms"},
        {"metric": "load_average_1m_at_end", "value": round(load[0], 2), "unit": "load"},
    ]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gets", type=int, default=300)
    parser.add_argument("--watch-events", type=int, default=100)
    parser.add_argument(
        "--baseline", action="append", default=[], metavar="NAME=DIR", help="another Tether source tree as path NAME"
    )
    parser.add_argument("--mixed", action="store_true", help="also time Tether kas + upstream agentk and the reverse")
    parser.add_argument("--profile", type=Path, help="directory for py-spy stacks of Tether kas and agentk")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    baselines = {name: Path(src) for name, _, src in (b.partition("=") for b in args.baseline)}
    results = asyncio.run(run(args.pods, args.runs, args.gets, args.watch_events, baselines, args.profile, args.mixed))
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
