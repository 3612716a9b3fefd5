"""Benchmark the Graph API engine on a real local cluster (issue 6 acceptance figures).

Usage: ``uv run python bench/graph.py [--skip-20000] [--changes N]``

* Starts a private cluster (``tether.devenv``) with kwok nodes, creates a graph of about 5,000 objects
  (200 Deployments x 15 replicas -> 200 ReplicaSets and 3,000 Pods, plus ConfigMaps, Secrets and
  Services), then about 15,000 more in a second namespace (20,000 in total).
* The agent side runs in a child process (``--serve``): a gRPC server with :class:`GraphServicer` on a
  unix socket, i.e. agentk's ``WatchGraph`` without the tunnel. Its RSS is read from ``/proc``.
* The parent plays kas: it calls ``WatchGraph`` and converts every response to the client JSON
  (``response_to_json``), counting vertices until the whole graph has been delivered.

Figures (written to ``bench/results/graph.json`` as ``{"metric", "value", "unit"}``):

* ``initial_5000_seconds`` / ``initial_20000_seconds``: request sent -> every vertex received as JSON,
  with the objects already in the cluster (the engine lists and syncs its watches inside this time).
* ``agentk_rss_growth_5000_mib`` / ``..._20000_mib``: RSS of the serving process after delivery minus
  before the request (after a warm-up request on an empty namespace).
* ``change_to_action_p99_ms`` (and p50): a ConfigMap is patched through the API server; time until its
  ``svx`` with the new content arrives as JSON (sequential changes, 5,000-object graph).
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
import grpc
from grpc import aio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import RunningHub
from tests.fixtures.system import System, write_private_secret
from tether.devenv import pki
from tether.devenv.cluster import LocalCluster
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.modules.graph.agent.servicer import WATCH_GRAPH_FULL_METHOD, WATCH_GRAPH_SERVICE, GraphServicer
from tether.modules.graph.engine.request import decode_request
from tether.modules.graph.rpc.wire import request_to_proto, response_to_json
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2

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


# ---- agent side (child process) ---------------------------------------------------------------------


async def serve(socket_path: str, kubeconfig: str) -> None:
    """Serve WatchGraph on ``unix://socket_path`` until stdin closes."""

    kube = KubeClient(load_credentials(kubeconfig))
    options = [("grpc.max_send_message_length", 16 << 20), ("grpc.max_receive_message_length", 16 << 20)]
    server = aio.server(options=options)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(WATCH_GRAPH_SERVICE, GraphServicer(kube).method_handlers())]
    )
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)
    await kube.close()


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
        async with self.session.request(method, self.server + path, json=body, headers=headers) as response:
            data = await response.json(content_type=None)
            if response.status >= 300 and response.status != 409:
                raise RuntimeError(f"{method} {path}: {response.status} {data}")
            return data

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
            query = "?limit=5000&fieldSelector=status.phase%3DRunning" + (f"&continue={token}" if token else "")
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
                query = f"?limit=2000&continue={token}" if token else "?limit=2000"
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


async def watch(channel: aio.Channel, namespaces: list[str]) -> aio.UnaryStreamCall[Any, Any]:

    request = decode_request(
        json.dumps(
            {"queries": [{"include": {"resource_selector_expression": QUERY}}], "namespaces": {"names": namespaces}}
        )
    )
    method = channel.unary_stream(
        WATCH_GRAPH_FULL_METHOD,
        request_serializer=rpc_pb2.WatchGraphRequest.SerializeToString,
        response_deserializer=rpc_pb2.WatchGraphResponse.FromString,
    )
    return method(request_to_proto(request))


async def initial_delivery(
    channel: aio.Channel, namespaces: list[str], expected: int
) -> tuple[float, aio.UnaryStreamCall[Any, Any], set[tuple[str, str, str]]]:
    """Seconds until ``expected`` vertices arrived as client JSON; the call stays open."""

    started = time.perf_counter()
    call = await watch(channel, namespaces)
    seen: set[tuple[str, str, str]] = set()
    async for response in call:
        message = json.loads(response_to_json(response))
        for action in message.get("actions", []):
            if "svx" in action:
                vx = action["svx"]["vx"]
                seen.add((vx["r"], vx.get("ns", ""), vx["n"]))
        if len(seen) >= expected:
            return time.perf_counter() - started, call, seen
    raise RuntimeError("stream ended")


async def change_latency(api: Api, call: aio.UnaryStreamCall[Any, Any], namespace: str, changes: int) -> list[float]:
    """Patch ConfigMaps one at a time; latency until the matching svx arrives (ms)."""

    responses: asyncio.Queue[bytes] = asyncio.Queue()

    async def reader() -> None:
        async for response in call:
            responses.put_nowait(response_to_json(response))

    task = asyncio.create_task(reader())
    await asyncio.sleep(1.0)
    while not responses.empty():
        responses.get_nowait()
    latencies: list[float] = []
    try:
        for i in range(changes):
            name = f"cm-{i}"
            value = f"change-{i}-{time.time_ns()}"
            started = time.perf_counter()
            await api.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                {"data": {"i": value}},
                "application/merge-patch+json",
            )
            while True:
                raw = await asyncio.wait_for(responses.get(), 30)
                if value.encode() in raw:
                    latencies.append((time.perf_counter() - started) * 1000)
                    break
    finally:
        task.cancel()
    return latencies


async def initial_delivery_through_kas(
    url: str, token: str, ca_file: Path, namespaces: list[str], expected: int
) -> float:
    """Seconds until ``expected`` vertices arrived over kas' Graph API WebSocket (the whole real path)."""
    request = {"queries": [{"include": {"resource_selector_expression": QUERY}}], "namespaces": {"names": namespaces}}
    context = ssl.create_default_context(cafile=str(ca_file))
    seen: set[tuple[str, str, str]] = set()
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        ws = await session.ws_connect(
            url + "graph",
            protocols=["gitlab-agent-graph-api"],
            headers={"Authorization": f"Bearer {token}"},
            ssl=context,
            max_msg_size=16 << 20,
        )
        await ws.send_str(json.dumps(request))
        async for message in ws:
            for action in json.loads(message.data).get("actions", []):
                if "svx" in action:
                    vx = action["svx"]["vx"]
                    seen.add((vx["r"], vx.get("ns", ""), vx["n"]))
            if len(seen) >= expected:
                elapsed = time.perf_counter() - started
                await ws.close()
                return elapsed
    raise RuntimeError(f"stream ended after {len(seen)} of {expected} vertices")


async def through_kas(directory: Path, kubeconfig: Path, namespaces: list[str], expected: int) -> tuple[float, float]:
    """The 5,000-object graph through a real kas and ``tether agentk``: (seconds, agentk RSS growth MiB)."""
    directory.mkdir(parents=True, exist_ok=True)
    running = RunningHub(directory / "hub")
    hub = running.hub
    tls = pki.generate(directory / "proxy-tls")
    system = System(directory, hub, write_private_secret(directory / "private_secret"), kubeconfig, None, tls)
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
        assert kas.k8s_proxy_ca is not None
        # Warm-up on an empty namespace, so the measurement starts from a connected, idle agent.
        await initial_delivery_through_kas(kas.k8s_proxy_url, f"pat:{agent_id}:{pat}", kas.k8s_proxy_ca, ["warmup"], 2)
        before = rss_mib(agentk.process.pid)
        seconds = await initial_delivery_through_kas(
            kas.k8s_proxy_url, f"pat:{agent_id}:{pat}", kas.k8s_proxy_ca, namespaces, expected
        )
        return seconds, rss_mib(agentk.process.pid) - before
    finally:
        system.stop_all()
        running.stop()


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tether-graph-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", nodes=4)
        info = cluster.start()
        socket_path = f"{tmp}/graph.sock"
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", socket_path, "--kubeconfig", str(info.kubeconfig)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "READY"
            channel = aio.insecure_channel(
                f"unix://{socket_path}", options=[("grpc.max_receive_message_length", 16 << 20)]
            )
            async with Api(info.server, info.token, info.ca_file) as api:
                await api.request("POST", "/api/v1/namespaces", {"metadata": {"name": "warmup"}})
                _, warm, _ = await initial_delivery(channel, ["warmup"], 2)  # kube-root-ca.crt + default SA
                warm.cancel()
                await asyncio.sleep(2)
                print("populating 5,000 objects", flush=True)
                total_5k = await populate(api, "bench-5k", 5000)
                before = rss_mib(child.pid)
                seconds, call, _ = await initial_delivery(channel, ["bench-5k"], total_5k)
                growth = rss_mib(child.pid) - before
                print(f"5k: {total_5k} objects in {seconds:.2f} s, RSS +{growth:.1f} MiB", flush=True)
                results += [
                    {"metric": "objects_5000", "value": total_5k, "unit": "objects"},
                    {"metric": "initial_5000_seconds", "value": round(seconds, 2), "unit": "s"},
                    {"metric": "agentk_rss_growth_5000_mib", "value": round(growth, 1), "unit": "MiB"},
                ]
                latencies = sorted(await change_latency(api, call, "bench-5k", args.changes))
                call.cancel()
                e2e_s, e2e_growth = await through_kas(Path(tmp) / "e2e", info.kubeconfig, ["bench-5k"], total_5k)
                print(f"5k through kas + tether agentk: {e2e_s:.2f} s, agentk RSS +{e2e_growth:.1f} MiB", flush=True)
                results += [
                    {"metric": "e2e_initial_5000_seconds", "value": round(e2e_s, 2), "unit": "s"},
                    {"metric": "e2e_agentk_rss_growth_5000_mib", "value": round(e2e_growth, 1), "unit": "MiB"},
                ]
                p50 = statistics.median(latencies)
                p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
                print(f"change->action p50 {p50:.1f} ms p99 {p99:.1f} ms over {len(latencies)}", flush=True)
                results += [
                    {"metric": "change_to_action_p50_ms", "value": round(p50, 1), "unit": "ms"},
                    {"metric": "change_to_action_p99_ms", "value": round(p99, 1), "unit": "ms"},
                ]
                if not args.skip_20000:
                    await asyncio.sleep(3)
                    print("populating 15,000 more objects", flush=True)
                    total_15k = await populate(api, "bench-15k", 15000)
                    before = rss_mib(child.pid)
                    seconds, call, _ = await initial_delivery(channel, ["bench-5k", "bench-15k"], total_5k + total_15k)
                    growth = rss_mib(child.pid) - before
                    call.cancel()
                    print(f"20k: {total_5k + total_15k} objects in {seconds:.2f} s, RSS +{growth:.1f} MiB", flush=True)
                    results += [
                        {"metric": "objects_20000", "value": total_5k + total_15k, "unit": "objects"},
                        {"metric": "initial_20000_seconds", "value": round(seconds, 2), "unit": "s"},
                        {"metric": "agentk_rss_growth_20000_mib", "value": round(growth, 1), "unit": "MiB"},
                    ]
            await channel.close()
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(30)
            cluster.stop()
    return results


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--skip-20000", action="store_true", help="only the 5,000-object graph")
    parser.add_argument("--changes", type=int, default=200, help="ConfigMap changes for the latency figure")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.kubeconfig))
        return
    results = asyncio.run(run(args))
    results.append({"metric": "cpu_count", "value": os.cpu_count(), "unit": "cores"})
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
