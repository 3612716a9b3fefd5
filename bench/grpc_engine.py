"""gRPC Core's two I/O engines side by side: one stream's round trip and its CPU (issue 28, change 12).

Usage: ``uv run python bench/grpc_engine.py [--round-trips 3000] [--pairs 2]``

For each setting of ``GRPC_EXPERIMENTS`` (grpcio's defaults, then the one ``tether`` selects,
``tether.tool.grpc_core.LEGACY_IO_EXPERIMENTS``), alternating ``--pairs`` times, a server process (grpc.aio on
uvloop, a bidirectional echo of raw bytes) and a client process are started on loopback; the client sends a
400-byte message and waits for its echo, ``--round-trips`` times after 200 unmeasured ones. Printed per run: the
round trip's p50 and p90 in µs, and the CPU per round trip of the client (``getrusage``) and of the server
(psutil). Nothing is written to ``bench/results``: the figures that compare Tether with upstream are
``bench/interop.py``'s, this one says why they moved.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from tether.tool.grpc_core import LEGACY_IO_EXPERIMENTS
from tether_devenv.process import free_port

#: Server or client, by argv: ``server PORT`` or ``client PORT ROUND_TRIPS``; the engine comes from the environment.
PEER = """
import asyncio, resource, statistics, sys, time
import grpc
import uvloop
from grpc import aio

def same(data):
    return data

async def serve(port):
    async def echo(requests, _context):
        async for message in requests:
            yield message
    method = grpc.stream_stream_rpc_method_handler(echo, same, same)
    server = aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {"Echo": method}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

async def client(port, count):
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream("/bench.Echo/Echo", request_serializer=same, response_deserializer=same)()
    message = b"x" * 400
    for _ in range(200):
        await call.write(message)
        await call.read()
    before = resource.getrusage(resource.RUSAGE_SELF)
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        await call.write(message)
        await call.read()
        samples.append((time.perf_counter() - began) * 1e6)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / count * 1e6
    print(statistics.median(samples), statistics.quantiles(samples, n=10)[-1], cpu, flush=True)

if sys.argv[1] == "server":
    uvloop.run(serve(int(sys.argv[2])))
else:
    uvloop.run(client(int(sys.argv[2]), int(sys.argv[3])))
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far, all its threads."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def one_run(experiments: str | None, round_trips: int) -> tuple[float, float, float, float]:
    """(p50 µs, p90 µs, client CPU µs, server CPU µs) per round trip with ``GRPC_EXPERIMENTS`` set or not."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if experiments is not None:
        env["GRPC_EXPERIMENTS"] = experiments
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", PEER, "server", str(port)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("the echo server did not start")
        time.sleep(0.5)
        before = cpu_seconds(server.pid)
        done = subprocess.run(
            [sys.executable, "-c", PEER, "client", str(port), str(round_trips)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        server_cpu = (cpu_seconds(server.pid) - before) / round_trips * 1e6
    finally:
        server.kill()
        server.wait()
    p50, p90, client_cpu = (float(x) for x in done.stdout.split())
    return p50, p90, client_cpu, server_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for pair in range(args.pairs):
        for name, experiments in (("grpcio defaults", None), ("tether's engine", LEGACY_IO_EXPERIMENTS)):
            p50, p90, client_cpu, server_cpu = one_run(experiments, args.round_trips)
            print(
                f"pair {pair + 1}, {name:16s}: round trip p50 {p50:5.0f} µs, p90 {p90:5.0f} µs; CPU per round trip:"
                f" client {client_cpu:4.0f} µs, server {server_cpu:4.0f} µs",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
