"""Profile the Graph API engine on the benchmark's workload: where the bytes and the seconds go.

Usage::

    uv run python bench/graph_profile.py cluster DIR [--objects 5000]   # start a cluster, populate, keep it up
    uv run python bench/graph_profile.py memory --kubeconfig DIR/cluster/admin.kubeconfig [--top 25]
    uv run python bench/graph_profile.py cpu --kubeconfig DIR/cluster/admin.kubeconfig [--out profile.txt]

``cluster`` starts a private cluster (kwok nodes), creates the benchmark graph (``bench/graph.py``'s
workload: Deployments, ReplicaSets, Pods, Services, ConfigMaps, Secrets) and waits until it is quiet, then
stays up until interrupted. ``memory`` runs one engine in-process under ``tracemalloc`` and reports what
is still allocated once the whole initial state (every vertex and arc) has been pulled and discarded,
grouped by source line. ``cpu`` does the same under ``cProfile`` and prints the top functions by
cumulative and by own time. Both read the namespaces the ``cluster`` command populated.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import pstats
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.graph import QUERY, Api, populate
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.modules.graph.engine.engine import EngineOptions, GraphEngine
from tether.modules.graph.engine.request import parse_request
from tether.modules.graph.rpc.wire import response_to_json, response_to_proto
from tether_devenv.cluster import LocalCluster


async def _cluster(directory: Path, objects: int) -> None:
    cluster = LocalCluster(directory / "cluster", nodes=4, progress=print)
    info = cluster.start()
    try:
        async with Api(info.server, info.token, info.ca_file) as api:
            total = await populate(api, "bench-5k", 5000)
            if objects > 5000:
                total += await populate(api, "bench-more", objects - 5000)
        print(f"READY {total} objects; kubeconfig {info.kubeconfig}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        cluster.stop()


async def _initial_state(kubeconfig: str, namespaces: list[str]) -> tuple[GraphEngine, KubeClient, int, int, float]:
    """Run an engine until its initial state has been pulled; returns it still running."""
    kube = KubeClient(load_credentials(kubeconfig))
    request = {"queries": [{"include": {"resource_selector_expression": QUERY}}], "namespaces": {"names": namespaces}}
    engine = GraphEngine(kube, parse_request(json.dumps(request)), EngineOptions())
    started = time.perf_counter()
    engine.start()
    vertices = arcs = 0
    while True:
        try:
            batch = await asyncio.wait_for(engine.next_batch(), 3.0)
        except TimeoutError:
            break
        response_to_json(response_to_proto(batch.actions, batch.warnings))
        for action in batch.actions:
            name = type(action).__name__
            vertices += name == "SetVertex"
            arcs += name == "SetArc"
    return engine, kube, vertices, arcs, time.perf_counter() - started - 3.0


async def _memory(kubeconfig: str, namespaces: list[str], top: int) -> None:
    gc.collect()
    tracemalloc.start(4)
    base = tracemalloc.take_snapshot()
    engine, kube, vertices, arcs, seconds = await _initial_state(kubeconfig, namespaces)
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot()
    print(f"{vertices} vertices, {arcs} arcs in {seconds:.2f} s (under tracemalloc)")
    print(
        f"traced now {current / 2**20:.1f} MiB ({current / max(vertices, 1):.0f} B/vertex), peak {peak / 2**20:.1f} MiB"
    )
    stats = snapshot.compare_to(base, "lineno")
    print(f"\ntop {top} source lines by retained bytes:")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        print(
            f"{stat.size_diff / 2**20:8.2f} MiB {stat.size_diff / max(vertices, 1):7.0f} B/vx"
            f" {stat.count_diff:8d} blocks  {frame.filename.split('/src/')[-1]}:{frame.lineno}"
        )
    await engine.close()
    await kube.close()


async def _cpu(kubeconfig: str, namespaces: list[str], out: str | None) -> None:
    profile = cProfile.Profile()
    profile.enable()
    engine, kube, vertices, arcs, seconds = await _initial_state(kubeconfig, namespaces)
    profile.disable()
    print(f"{vertices} vertices, {arcs} arcs in {seconds:.2f} s (under cProfile)")
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    if out:
        Path(out).write_text(text.getvalue())
    print(text.getvalue())
    await engine.close()
    await kube.close()


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["cluster", "memory", "cpu"])
    parser.add_argument("directory", nargs="?", type=Path, help="cluster: state directory")
    parser.add_argument("--objects", type=int, default=5000, help="cluster: objects to create")
    parser.add_argument("--kubeconfig", help="memory/cpu: the cluster's admin kubeconfig")
    parser.add_argument("--namespaces", default="bench-5k", help="memory/cpu: comma-separated namespaces")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out")
    args = parser.parse_args()
    namespaces = args.namespaces.split(",")
    if args.command == "cluster":
        asyncio.run(_cluster(args.directory, args.objects))
    elif args.command == "memory":
        asyncio.run(_memory(args.kubeconfig, namespaces, args.top))
    else:
        asyncio.run(_cpu(args.kubeconfig, namespaces, args.out))


if __name__ == "__main__":
    main()
