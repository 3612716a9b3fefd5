"""Benchmark the Graph API at scale (issue 15), through the whole real path, each size in a fresh agentk.

Usage (one command; see docs/benchmarks.md)::

    uv run python bench/graph.py                       # 5,000, 20,000 and 50,000 objects
    uv run python bench/graph.py --sizes 5000          # a quick run

* A private cluster (``tether_devenv``, kwok nodes) receives the benchmark graph: per 5,000 objects 200
  Deployments x 15 replicas (200 ReplicaSets, 3,000 Pods), about 1,000 ConfigMaps, 400 Secrets and 200
  Services, in namespaces that add up to each size (``bench-5k``; ``bench-15k``; ``bench-30k``). Before
  each measurement the bench waits until every Pod is Running and the cluster is quiet: the API server's
  revision must advance by at most ``--quiet-revisions`` in ``--quiet-window`` seconds (the controllers
  keep updating Endpoints for a while after large rollouts).
* For each size a fresh ``tether kas`` (hub stand-in) and a fresh ``tether agentk`` start; agentk dials
  kas and the client opens the Graph API WebSocket ``wss://.../k8s-proxy/graph`` on kas, so every message
  goes agentk -> tunnel -> kas -> WebSocket.
* The client counts distinct vertices and arcs. The clock runs from the WebSocket upgrade request to the
  message that brought the last new vertex or arc of the initial state; that point is known once every
  object is a vertex and the stream has then been silent for ``--settle`` seconds.
* RSS growth: agentk's ``VmRSS`` when the initial state is complete minus its ``VmRSS`` while idle and
  connected before the request. agentk CPU: user + system time over the same interval.
* At the largest size, ``--changes`` ConfigMaps are patched one at a time through the API server; the
  latency is until the WebSocket message with the ``svx`` carrying the new value arrives.

Metrics (``bench/results/graph.json``): ``initial_<N>_seconds`` for every size,
``agentk_rss_growth_<N>_mib`` and ``agentk_cpu_<N>_seconds`` for every size, ``arcs_<N>`` / ``objects_<N>``,
``change_to_action_p99_ms_<N>`` (and p50) at the largest size, and the load average at the start of
each measurement.
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
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import RunningHub
from tests.fixtures.system import System, write_private_secret
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo, LocalCluster

RESULTS = Path(__file__).parent / "results" / "graph.json"
QUERY = (
    "group == '' && resource in ['pods', 'configmaps', 'secrets', 'services', 'serviceaccounts'] || "
    "group == 'apps' && resource in ['deployments', 'replicasets']"
)
COLLECTIONS = [
    ("/api/v1", "pods"),
    ("/api/v1", "configmaps"),
    ("/api/v1", "secrets"),
    ("/api/v1", "services"),
    ("/api/v1", "serviceaccounts"),
    ("/apis/apps/v1", "deployments"),
    ("/apis/apps/v1", "replicasets"),
]


# ---- kas/client side ----------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Api:
    """Minimal async writer for populating the cluster."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:

        self.server = server
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.ssl = ssl.create_default_context(cafile=str(ca_file))
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, limit=64))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        assert self.session is not None
        headers = dict(self.headers, **{"Content-Type": content_type})
        for attempt in range(8):
            try:
                async with self.session.request(method, self.server + path, json=body, headers=headers) as response:
                    data = await response.json(content_type=None)
                    if response.status in (429, 500, 503, 504) and attempt < 7:
                        # A busy (shared) machine: the API server times out now and then. A create that did
                        # happen answers 409 when retried, which counts as done.
                        await asyncio.sleep(0.5 * 2**attempt)
                        continue
                    if response.status >= 300 and response.status != 409:
                        raise RuntimeError(f"{method} {path}: {response.status} {data}")
                    return data
            except (aiohttp.ClientConnectionError, TimeoutError):
                if attempt == 7:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    async def create_all(self, items: list[tuple[str, dict[str, Any]]], concurrency: int = 48) -> None:
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        for item in items:
            queue.put_nowait(item)

        async def worker() -> None:
            while not queue.empty():
                path, body = queue.get_nowait()
                await self.request("POST", path, body)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def count_running(self, namespace: str) -> int:
        """Pods in phase Running (selectors give no remainingItemCount: page through)."""
        total, token = 0, ""
        while True:
            query = "?limit=5000&fieldSelector=status.phase%3DRunning" + (f"&continue={quote(token)}" if token else "")
            page = await self.request("GET", f"/api/v1/namespaces/{namespace}/pods{query}")
            total += len(page["items"])
            token = page["metadata"].get("continue", "")
            if not token:
                return total

    async def count(self, namespace: str) -> int:
        total = 0
        for base, resource in COLLECTIONS:
            token = ""
            while True:
                query = f"?limit=2000&continue={quote(token)}" if token else "?limit=2000"
                page = await self.request("GET", f"{base}/namespaces/{namespace}/{resource}{query}")
                total += len(page["items"])
                token = page["metadata"].get("continue", "")
                if not token:
                    break
        return total


def objects(
    namespace: str, deployments: int, replicas: int, configmaps: int, secrets: int, services: int
) -> list[tuple[str, dict[str, Any]]]:
    """The objects of one benchmark namespace."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(configmaps):
        out.append(
            (
                f"/api/v1/namespaces/{namespace}/configmaps",
                {"metadata": {"name": f"cm-{i}"}, "data": {"k": "v" * 40, "i": str(i)}},
            )
        )
    for i in range(secrets):
        out.append(
            (
                f"/api/v1/namespaces/{namespace}/secrets",
                {"metadata": {"name": f"secret-{i}"}, "stringData": {"password": "x" * 32}},
            )
        )
    for i in range(services):
        out.append(
            (
                f"/api/v1/namespaces/{namespace}/services",
                {"metadata": {"name": f"svc-{i}"}, "spec": {"selector": {"app": f"app-{i}"}, "ports": [{"port": 80}]}},
            )
        )
    for i in range(deployments):
        labels = {"app": f"app-{i}"}
        container = {
            "name": "c",
            "image": "nginx",
            "envFrom": [{"configMapRef": {"name": f"cm-{i % max(configmaps, 1)}"}}],
            "env": [
                {
                    "name": "P",
                    "valueFrom": {"secretKeyRef": {"name": f"secret-{i % max(secrets, 1)}", "key": "password"}},
                }
            ],
        }
        out.append(
            (
                f"/apis/apps/v1/namespaces/{namespace}/deployments",
                {
                    "metadata": {"name": f"dep-{i}", "labels": labels},
                    "spec": {
                        "replicas": replicas,
                        "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
                    },
                },
            )
        )
    return out


async def populate(api: Api, namespace: str, size: int) -> int:
    """Create about ``size`` objects in ``namespace`` and wait until the controllers created them all."""
    scale = size // 5000
    deployments, replicas = 200 * scale, 15
    await api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    await api.create_all(objects(namespace, deployments, replicas, 1000 * scale - 1, 400 * scale, 200 * scale - 1))
    expected_pods = deployments * replicas
    while True:  # until kwok has marked every pod Running, so the cluster is quiet when measuring
        running = await api.count_running(namespace)
        if running >= expected_pods:
            break
        print(f"  {namespace}: {running}/{expected_pods} pods running", flush=True)
        await asyncio.sleep(3)
    await asyncio.sleep(10)  # controllers finish their status updates
    return await api.count(namespace)


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    """The 1-minute load average (as ``uptime`` shows it)."""
    return os.getloadavg()[0]


async def wait_quiet(api: Api, window_s: float, max_revisions: int, limit_s: float = 1200.0) -> None:
    """Wait until the API server's revision advances by at most ``max_revisions`` in ``window_s``."""
    started = time.monotonic()

    async def revision() -> int:
        listed = await api.request("GET", "/api/v1/namespaces?limit=1")
        return int(listed["metadata"]["resourceVersion"])

    previous = await revision()
    while True:
        await asyncio.sleep(window_s)
        current = await revision()
        if current - previous <= max_revisions:
            print(f"  cluster quiet (+{current - previous} revisions in {window_s:g} s)", flush=True)
            return
        if time.monotonic() - started > limit_s:
            print(f"  cluster still busy after {limit_s:g} s (+{current - previous}); measuring anyway", flush=True)
            return
        print(f"  waiting for a quiet cluster: +{current - previous} revisions in {window_s:g} s", flush=True)
        previous = current


class GraphClient:
    """A WebSocket Graph API client keeping the set of vertices and arcs and when each message arrived."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, started: float) -> None:
        self.ws = ws
        self.started = started
        self.vertices: set[tuple[str, str, str]] = set()
        self.arcs: set[tuple[Any, ...]] = set()
        self.last_new = started  # arrival of the last message that brought a new vertex or arc
        self.first_message = 0.0
        self.all_vertices = 0.0
        self.expected = 0
        self.messages: asyncio.Queue[bytes] = asyncio.Queue()

    def apply(self, data: str | bytes) -> None:
        grew = False
        for action in msgspec.json.decode(data).get("actions", []):
            if "svx" in action:
                vx = action["svx"]["vx"]
                key = (vx["r"], vx.get("ns", ""), vx["n"])
                if key not in self.vertices:
                    self.vertices.add(key)
                    grew = True
            elif "sarc" in action:
                arc = action["sarc"]
                key2 = (arc["s"]["r"], arc["s"].get("ns"), arc["s"]["n"], arc["d"]["r"], arc["d"].get("ns"))
                key2 += (arc["d"]["n"], arc["t"])
                if key2 not in self.arcs:
                    self.arcs.add(key2)
                    grew = True
        if grew:
            self.last_new = time.perf_counter()
        if not self.first_message:
            self.first_message = time.perf_counter() - self.started
        if not self.all_vertices and len(self.vertices) >= self.expected:
            self.all_vertices = time.perf_counter() - self.started

    async def initial_state(self, expected_vertices: int, settle_s: float, timeout_s: float = 600.0) -> float:
        """Seconds from the upgrade request to the last new vertex or arc of the initial state.

        The initial state is complete once every object is a vertex and no new vertex or arc has arrived for
        ``settle_s`` seconds; updates of known vertices (kwok keeps patching Pod status) do not count.
        """
        deadline = time.perf_counter() + timeout_s
        self.expected = expected_vertices
        while True:
            now = time.perf_counter()
            if len(self.vertices) >= expected_vertices:
                if now - self.last_new >= settle_s:
                    return self.last_new - self.started
                wait = settle_s - (now - self.last_new)
            else:
                wait = deadline - now
            try:
                message = await self.ws.receive(timeout=max(wait, 0.01))
            except TimeoutError:
                if len(self.vertices) >= expected_vertices:
                    continue
                raise RuntimeError(f"only {len(self.vertices)} of {expected_vertices} vertices arrived") from None
            if message.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"stream ended: {message.type} {message.data} {message.extra}")
            self.apply(message.data)

    async def read_into_queue(self) -> None:
        async for message in self.ws:
            self.messages.put_nowait(message.data.encode())


async def change_latency(api: Api, client: GraphClient, namespace: str, changes: int) -> list[float]:
    """Patch ConfigMaps one at a time; milliseconds until the message with the new content arrives."""
    task = asyncio.create_task(client.read_into_queue())
    latencies: list[float] = []
    try:
        for i in range(changes):
            value = f"change-{i}-{time.time_ns()}"
            started = time.perf_counter()
            await api.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/configmaps/cm-{i}",
                {"data": {"i": value}},
                "application/merge-patch+json",
            )
            while True:
                raw = await asyncio.wait_for(client.messages.get(), 30)
                if value.encode() in raw:
                    latencies.append((time.perf_counter() - started) * 1000)
                    break
    finally:
        task.cancel()
    return latencies


async def measure(
    directory: Path, kubeconfig: Path, api: Api, namespaces: list[str], expected: int, args: argparse.Namespace
) -> dict[str, float]:
    """One size in a fresh kas and agentk: initial state, RSS growth, CPU; change latency if asked."""
    directory.mkdir(parents=True, exist_ok=True)
    running = RunningHub(directory / "hub")
    hub = running.hub
    tls = pki.generate(directory / "proxy-tls")
    system = System(directory, hub, write_private_secret(directory / "private_secret"), kubeconfig, None, tls)
    figures: dict[str, float] = {}
    try:
        kas = system.kas(use_redis=False)
        token, pat, agent_id = "graph-bench-agent", "graph-bench-pat", 901
        hub.add_agent(token, agent_id, 1)
        hub.grant_proxy_access(pat, "bench", agent_id, 1)
        agentk = system.agentk(token, kas)
        while True:
            try:
                if agentk.readiness()[0] == 200:
                    break
            except OSError:  # its observability listener is not up yet
                pass
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # connected and idle: tunnels up, configuration received
        assert kas.k8s_proxy_ca is not None
        pid = agentk.process.pid
        assert pid is not None
        context = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
        async with aiohttp.ClientSession() as session:

            async def open_graph(names: list[str]) -> GraphClient:
                started = time.perf_counter()
                ws = await session.ws_connect(
                    kas.k8s_proxy_url + "graph",
                    protocols=["gitlab-agent-graph-api"],
                    headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"},
                    ssl=context,
                    max_msg_size=64 << 20,
                )
                query = [{"include": {"resource_selector_expression": QUERY}}]
                await ws.send_str(json.dumps({"queries": query, "namespaces": {"names": names}}))
                return GraphClient(ws, started)

            # agentk loads the graph engine and CEL with the first graph (issue 10): a graph of the two objects
            # of an empty namespace loads that code, so the figures below are what the objects cost.
            rss_idle = rss_mib(pid)
            warmup = await open_graph([WARMUP_NAMESPACE])
            await warmup.initial_state(2, 1.0)
            await warmup.ws.close()
            await asyncio.sleep(2)
            figures["load"] = load_average()
            rss_before, cpu_before = rss_mib(pid), proc_cpu_seconds(pid)
            figures["code_rss_mib"] = rss_before - rss_idle
            kas_pid = kas.process.pid if kas.process is not None else None
            kas_cpu_before = proc_cpu_seconds(kas_pid) if kas_pid else 0.0
            client_cpu_before = time.process_time()
            client = await open_graph(namespaces)
            ws = client.ws
            figures["seconds"] = await client.initial_state(expected, args.settle)
            figures["rss_growth_mib"] = rss_mib(pid) - rss_before
            figures["cpu_seconds"] = proc_cpu_seconds(pid) - cpu_before
            figures["kas_cpu_seconds"] = proc_cpu_seconds(kas_pid) - kas_cpu_before if kas_pid else 0.0
            figures["client_cpu_seconds"] = time.process_time() - client_cpu_before
            figures["first_message_seconds"] = client.first_message
            figures["all_vertices_seconds"] = client.all_vertices
            figures["vertices"] = len(client.vertices)
            figures["arcs"] = len(client.arcs)
            if args.changes and expected >= max(args.sizes):
                latencies = sorted(await change_latency(api, client, namespaces[0], args.changes))
                figures["p50_ms"] = statistics.median(latencies)
                figures["p99_ms"] = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            await ws.close()
    finally:
        system.stop_all()
        running.stop()
    return figures


def metric(name: str, value: float, unit: str) -> dict[str, Any]:
    """One entry of ``bench/results/graph.json``."""
    return {"metric": name, "value": value, "unit": unit}


#: A namespace with just its ServiceAccount and root CA ConfigMap, for the request that loads the engine.
WARMUP_NAMESPACE = "bench-warmup"

#: Namespaces the sizes are built from, and how many objects each adds.
LAYERS = [("bench-5k", 5000), ("bench-15k", 15000), ("bench-30k", 30000)]
LAYER_TOTALS = [5000, 20000, 50000]


async def wait_until(clock: str | None) -> None:
    """Sleep until ``clock`` (``HH:MM`` UTC, today or tomorrow) when given."""
    if not clock:
        return
    now = time.gmtime()
    hours, minutes = (int(part) for part in clock.split(":"))
    delay = ((hours * 60 + minutes) - (now.tm_hour * 60 + now.tm_min)) * 60 - now.tm_sec
    if delay < -12 * 3600:
        delay += 24 * 3600
    if delay > 0:
        print(f"waiting until {clock} UTC to measure ({delay / 60:.0f} min)", flush=True)
        await asyncio.sleep(delay)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tether-graph-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", nodes=args.nodes)
        reused = ClusterInfo.load(args.cluster) if args.cluster else None
        if args.cluster and reused is None:
            raise SystemExit(f"no running cluster recorded in {args.cluster}")
        info = reused or cluster.start()
        try:
            async with Api(info.server, info.token, info.ca_file) as api:
                await api.request("POST", "/api/v1/namespaces", {"metadata": {"name": WARMUP_NAMESPACE}})
                # Every namespace first (a size watches only its own namespaces), then the measurements.
                layers: list[tuple[str, int]] = []  # (namespace, objects)
                while sum(count for _, count in layers) < max(args.sizes):
                    namespace, count = LAYERS[len(layers)]
                    if reused is not None:  # populated by an earlier run of this bench
                        layers.append((namespace, await api.count(namespace)))
                        continue
                    print(f"populating {count:,} objects in {namespace}", flush=True)
                    layers.append((namespace, await populate(api, namespace, count)))
                await wait_until(args.not_before)
                for size in sorted(args.sizes):
                    included = layers[: next(i + 1 for i in range(len(layers)) if LAYER_TOTALS[i] >= size)]
                    namespaces = [namespace for namespace, _ in included]
                    total = sum(count for _, count in included)
                    await wait_quiet(api, args.quiet_window, args.quiet_revisions)
                    print(f"measuring {total:,} objects (load {load_average():.2f})", flush=True)
                    runs = []
                    for attempt in range(args.repeat):
                        runs.append(
                            await measure(
                                Path(tmp) / f"run-{size}-{attempt}", info.kubeconfig, api, namespaces, total, args
                            )
                        )
                        print(
                            f"  run {attempt + 1}: {runs[-1]['seconds']:.2f} s, +{runs[-1]['rss_growth_mib']:.1f} MiB"
                        )
                    figures = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]  # the median run
                    print(
                        f"{size:,}: {figures['vertices']:,.0f} vertices, {figures['arcs']:,.0f} arcs in "
                        f"{figures['seconds']:.2f} s; agentk RSS +{figures['rss_growth_mib']:.1f} MiB "
                        f"(+{figures['code_rss_mib']:.1f} MiB for the engine's code before), "
                        f"CPU {figures['cpu_seconds']:.2f} s (kas {figures['kas_cpu_seconds']:.2f} s, client "
                        f"{figures['client_cpu_seconds']:.2f} s); first message "
                        f"{figures['first_message_seconds']:.2f} s, all vertices "
                        f"{figures['all_vertices_seconds']:.2f} s; load {figures['load']:.2f}",
                        flush=True,
                    )
                    results += [
                        metric(f"objects_{size}", total, "objects"),
                        metric(f"arcs_{size}", int(figures["arcs"]), "arcs"),
                        metric(f"initial_{size}_seconds", round(figures["seconds"], 2), "s"),
                        metric(f"all_vertices_{size}_seconds", round(figures["all_vertices_seconds"], 2), "s"),
                        metric(f"agentk_rss_growth_{size}_mib", round(figures["rss_growth_mib"], 1), "MiB"),
                        metric(f"agentk_graph_code_rss_{size}_mib", round(figures["code_rss_mib"], 1), "MiB"),
                        metric(f"agentk_cpu_{size}_seconds", round(figures["cpu_seconds"], 2), "s"),
                        metric(f"load_average_{size}", round(figures["load"], 2), "load"),
                    ]
                    if "p99_ms" in figures:
                        print(f"change->action p50 {figures['p50_ms']:.1f} p99 {figures['p99_ms']:.1f} ms", flush=True)
                        results += [
                            metric(f"change_to_action_p50_ms_{size}", round(figures["p50_ms"], 1), "ms"),
                            metric(f"change_to_action_p99_ms_{size}", round(figures["p99_ms"], 1), "ms"),
                        ]
        finally:
            cluster.stop()
    return results


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,20000,50000", help="comma-separated object counts (5000 steps)")
    parser.add_argument("--changes", type=int, default=200, help="ConfigMap changes at the largest size (0: none)")
    parser.add_argument("--nodes", type=int, default=6, help="kwok nodes (10,000 pods each)")
    parser.add_argument("--settle", type=float, default=5.0, help="silence that ends the initial state, seconds")
    parser.add_argument("--quiet-window", type=float, default=5.0, help="seconds per quiet-cluster check")
    parser.add_argument("--quiet-revisions", type=int, default=20, help="revisions allowed in a quiet window")
    parser.add_argument(
        "--cluster", type=Path, help="measure on the running cluster in this directory that an earlier run populated"
    )
    parser.add_argument("--not-before", help="populate at once but measure from HH:MM UTC (a shared machine)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per size (fresh agentk each; median)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results file")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if any(size not in (5000, 20000, 50000) for size in args.sizes):
        parser.error("sizes are 5000, 20000 and 50000")
    results = asyncio.run(run(args))
    results.append(metric("cpu_count", os.cpu_count() or 0, "cores"))
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
