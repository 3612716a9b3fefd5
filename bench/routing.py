"""Routing benchmarks (issue 3): latency, relay throughput, wake-up delay, memory per connected agent.

Usage: ``uv run python bench/routing.py [--calls N] [--agents N]``

Everything is real and runs on this machine: a private redis-server, kas processes (``tether kas``), a
benchmark agent process (``bench/bench_agent.py``: agentk's tunnel machinery serving raw methods) and,
for memory, a simulator process holding N agents' configuration streams and idle tunnels. The caller
is a gRPC client signing JWTs like the hub. Writes ``bench/results/routing.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import redis.asyncio as aioredis
from google.protobuf import any_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import RunningHub
from tests.fixtures.system import KAS_DEFAULT_CACHING, KasProc, System, write_private_secret
from tether.pb.gitlab.agent.event.event_pb2 import TunnelsAvailable
from tether.tool.events import events_channel
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, mint
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "routing.json"
HERE = Path(__file__).parent
AGENT_ID = 501


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used so far (``/proc/<pid>/stat``, clock ticks of 10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Caller:
    """The hub's side: raw calls to kas' api listener naming the agent in routing metadata."""

    def __init__(self, kas: KasProc, secret: bytes, agent_id: int) -> None:
        self.channel = grpc.aio.insecure_channel(kas.api_target)
        token = mint(secret, ISSUER_GITLAB, AUDIENCE_KAS, 3600)
        self.metadata = (("authorization", f"Bearer {token}"), ("kas-hop-routing-agent-id", str(agent_id)))
        self.echo = self.channel.unary_unary("/tether.bench.Bench/Echo")
        self.download = self.channel.unary_stream("/tether.bench.Bench/Download")

    async def latency_ms(self, calls: int) -> list[float]:
        payload = b"x" * 100
        for _ in range(min(200, calls)):
            await self.echo(payload, metadata=self.metadata, timeout=10)
        samples = []
        for _ in range(calls):
            began = time.perf_counter()
            await self.echo(payload, metadata=self.metadata, timeout=10)
            samples.append((time.perf_counter() - began) * 1000)
        return samples

    async def throughput_mb_s(self, total: int, chunk: int) -> float:
        began = time.perf_counter()
        received = 0
        async for piece in self.download(struct.pack("<qq", total, chunk), metadata=self.metadata, timeout=300):
            received += len(piece)
        assert received == total, (received, total)
        return total / (time.perf_counter() - began) / 1e6

    async def close(self) -> None:
        await self.channel.close()


class BenchAgents:
    """The benchmark agent process; ``connect`` starts one more embedded agent in it."""

    def __init__(self, directory: Path) -> None:
        self.log = (directory / "bench_agent.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "bench_agent.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )

    def connect(self, token: str, kas: KasProc) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"connect {token} {kas.agent_address.removeprefix('grpc://')}\n")
        self.proc.stdin.flush()

    async def connected_at(self, token: str) -> float:
        assert self.proc.stdout is not None
        line = await asyncio.to_thread(self.proc.stdout.readline)
        word, got, when = line.split()[:3] if line.startswith("connected") else ("?", line, "0")
        assert word == "connected" and got == token, line
        return float(when)

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class EventStamps:
    """When each ``TunnelsAvailable`` event reached a subscriber of its own (wall clock, per agent id)."""

    def __init__(self, system: System) -> None:
        assert system.redis is not None
        self.client = aioredis.Redis.from_url(system.redis.url)
        self.channel = events_channel(system.key_prefix)
        self.seen: dict[int, float] = {}
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        pubsub = self.client.pubsub()
        await pubsub.subscribe(self.channel)
        self.task = asyncio.create_task(self._read(pubsub))

    async def _read(self, pubsub: Any) -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                stamp = time.time()
                wrapped = any_pb2.Any.FromString(message["data"])
                event = TunnelsAvailable()
                if wrapped.Unpack(event):
                    self.seen.setdefault(event.agent_id, stamp)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.client.aclose()


async def wakeup_ms(
    system: System, kas1: KasProc, kas2: KasProc, agents: BenchAgents, rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Delay from an agent's first tunnel (on kas 2) to the completion of a request waiting on kas 1.

    The clock starts when the new agent has written its first tunnel's descriptor, which happens before its
    HTTP/2 connection is up, so the figure covers the connection, kas 2 authenticating the agent (a hub call),
    the tunnel tracker write, the pub/sub event, kas 1's attempt through kas 2 and the call itself. The second
    list is the part before the ``TunnelsAvailable`` event reached the bench's own subscriber (same rounds), the
    third when each round's tunnel came up, in seconds since the first one's (to match slow rounds with periodic
    work).
    """
    samples = []
    before_event = []
    tunnel_times: list[float] = []
    waiting_cpu = 0.0
    stamps = EventStamps(system)
    await stamps.start()
    for index in range(rounds):
        agent_id = 10_000 + index
        token = f"wake-{index}-{time.monotonic_ns()}"
        system.hub.add_agent(token, agent_id, 1)
        caller = Caller(kas1, system.hub.secret, agent_id)
        pending = asyncio.ensure_future(caller.echo(b"w", metadata=caller.metadata, timeout=30))
        while kas1.gauge("tunnel_find_requests_waiting") < 1:
            await asyncio.sleep(0.02)
        assert kas1.process is not None
        waiting_cpu -= cpu_s(kas1.process.pid)
        await asyncio.sleep(0.2)
        waiting_cpu += cpu_s(kas1.process.pid)
        agents.connect(token, kas2)
        tunnel_up = await agents.connected_at(token)
        await pending
        samples.append((time.time() - tunnel_up) * 1000)
        tunnel_times.append(tunnel_up)
        before_event.append((stamps.seen.get(agent_id, math.nan) - tunnel_up) * 1000)
        await caller.close()
    await stamps.stop()
    print(f"kas 1 CPU while a request waited for its agent: {100 * waiting_cpu / (0.2 * rounds):.0f} % of a core")
    return samples, before_event, [t - tunnel_times[0] for t in tunnel_times]


async def memory_per_agent(system: System, count: int) -> tuple[float, float, float]:
    """kas RSS before and after ``count`` simulated agents connect (2 idle tunnels + 1 config stream each)."""
    prefix = f"sim{time.monotonic_ns()}-"
    for i in range(count):
        system.hub.add_agent(f"{prefix}{i}", 100_000 + i, 200_000 + i // 10)
    kas = system.kas(agent={"configuration": {"poll_period": "3600s"}})
    await asyncio.sleep(2)
    assert kas.process is not None
    before = rss_kib(kas.process.pid)
    sim = subprocess.Popen(
        [sys.executable, str(HERE / "sim_agents.py"), kas.agent_address.removeprefix("grpc://"), prefix, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while kas.gauge("tunnels_idle") < 2 * count or kas.gauge("connected_agents_count") < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"simulated agents did not all connect: {kas.gauge('tunnels_idle')} tunnels")
            await asyncio.sleep(1)
        await asyncio.sleep(5)
        after = rss_kib(kas.process.pid)
    finally:
        assert sim.stdin is not None
        sim.stdin.close()
        sim.wait(60)
    return before / 1024, after / 1024, (after - before) / count


async def run(calls: int, agent_count: int, throughput_runs: int, wake_rounds: int) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        directory = Path(tmp)
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(directory / "hub")
        hub = running.hub
        private = write_private_secret(directory / "private_secret")
        system = System(directory, hub, private, None, redis)
        agents = BenchAgents(directory)
        try:
            kas1, kas2 = system.kas(**KAS_DEFAULT_CACHING), system.kas(**KAS_DEFAULT_CACHING)
            token = "bench-agent-token"
            hub.add_agent(token, AGENT_ID, 1)
            agents.connect(token, kas2)
            await agents.connected_at(token)
            same = Caller(kas2, hub.secret, AGENT_ID)
            cross = Caller(kas1, hub.secret, AGENT_ID)
            same_ms = await same.latency_ms(calls)
            cross_ms = await cross.latency_ms(calls)
            mb_s = [await cross.throughput_mb_s(256 * 1024 * 1024, 64 * 1024) for _ in range(throughput_runs)]
            await same.close()
            await cross.close()
            wake, wake_before_event, wake_at = await wakeup_ms(system, kas1, kas2, agents, wake_rounds)
            rss_before, rss_after, per_agent_kib = (
                await memory_per_agent(system, agent_count) if agent_count else (math.nan, math.nan, math.nan)
            )
        finally:
            agents.stop()
            system.stop_all()
            running.stop()
            redis.stop()
    figures = {
        "same_kas_unary_p50_ms": (statistics.median(same_ms), "ms"),
        "same_kas_unary_p99_ms": (percentile(same_ms, 99), "ms"),
        "cross_kas_unary_p50_ms": (statistics.median(cross_ms), "ms"),
        "cross_kas_unary_p99_ms": (percentile(cross_ms, 99), "ms"),
        "relay_throughput_mb_s": (statistics.median(mb_s) if mb_s else math.nan, "MB/s"),
        "wakeup_p50_ms": (statistics.median(wake), "ms"),
        "wakeup_p99_ms": (percentile(wake, 99), "ms"),
        "kas_rss_idle_mib": (rss_before, "MiB"),
        f"kas_rss_{agent_count}_agents_mib": (rss_after, "MiB"),
        "rss_per_agent_kib": (per_agent_kib, "KiB"),
    }
    for name, (value, unit) in figures.items():
        print(f"{name:32s} {value:10.2f} {unit}")
    after_event = [w - b for w, b in zip(wake, wake_before_event, strict=True)]
    for name, part in (("before the event", wake_before_event), ("after the event", after_event)):
        print(f"wake-up {name}: p50 {statistics.median(part):.2f} ms, p99 {percentile(part, 99):.2f} ms")
    slow = sorted(zip(wake, wake_before_event, wake_at, strict=True), reverse=True)[:5]
    shown = [(round(w, 1), round(b, 1), round(t, 1)) for w, b, t in slow]
    print(f"slowest wake-ups (total ms, before event ms, s since the first round): {shown}")
    print(f"load average {os.getloadavg()}")
    print(f"throughput runs (MB/s): {[round(x, 1) for x in mb_s]}")
    return [{"metric": k, "value": round(v, 2), "unit": u} for k, (v, u) in figures.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="unary calls per latency series")
    parser.add_argument("--agents", type=int, default=2000, help="simulated agents for the memory figure")
    parser.add_argument("--throughput-runs", type=int, default=3, help="256 MiB downloads (median reported)")
    parser.add_argument(
        "--wake-rounds", type=int, default=100, help="agents connecting to a waiting request (p99 of these)"
    )
    args = parser.parse_args()
    results = asyncio.run(run(args.calls, args.agents, args.throughput_runs, args.wake_rounds))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
