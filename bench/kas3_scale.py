"""Three kas on a Sentinel-managed Redis with 10,000 simulated agents (issue 26 item 4); not run in CI.

Set-up: a Redis master, one replica and three sentinels (``tests/fixtures/sentinel.py``, as the failover test),
the hub on a private PostgreSQL, three kas processes (``redis.sentinel``), and ``bench/sim_agents.py`` holding
the agents, **one HTTP/2 connection each** (a configuration stream and two idle tunnels per agent, as upstream
agentk's minimum), a third of them on each kas. One real benchmark agent per kas (``bench/bench_agent.py``)
answers routed calls.

Recorded into ``bench/results/ha.json`` (other entries kept):

- ``kas3_10000_agents_connect_seconds``: simulators started -> every agent configured and every kas holding its
  agents' tunnels idle;
- ``kas3_10000_agents_rss_mib_max`` (and per kas): kas ``VmRSS`` at steady state;
- ``kas3_routed_p50_ms`` / ``kas3_routed_p99_ms``: unary calls from every kas to the benchmark agents on the
  two other kas (hub-style caller on the api listener), at steady state with all agents connected;
- ``kas3_redis_used_memory_mib`` and ``kas3_redis_commands_per_second`` (the master's ``INFO``, over 30 s of
  steady state), with the same figures before the agents connected;
- the load average before and after (the machine is shared).

Usage: ``python bench/kas3_scale.py [--agents 10000] [--calls 300]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
import yaml
from sqlalchemy.ext.asyncio import AsyncSession

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.routing import BenchAgents, Caller, percentile, rss_kib
from tests.fixtures.hub import HubLauncher, RealHub, root_namespace, root_project
from tests.fixtures.sentinel import SentinelRedis
from tests.fixtures.system import TETHER, KasProc, System, http_get, write_private_secret
from tether.hub.db.agents import ClusterAgent, ClusterAgentToken
from tether_devenv.postgres_server import PostgresServer
from tether_devenv.process import ManagedProcess, free_port
from tether_devenv.redis_server import HOST

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "ha.json"
KAS = 3
STEADY_S = 30.0


class Simulator:
    """One ``bench/sim_agents.py`` process holding ``count`` agents against one kas."""

    def __init__(self, kas: KasProc, prefix: str, count: int) -> None:
        self.count = count
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "sim_agents.py"),
                kas.agent_address.removeprefix("grpc://"),
                prefix,
                str(count),
                "1",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.configured = False
        self.ended: dict[str, int] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            self.lines.put(line)

    def poll(self) -> None:
        while not self.lines.empty():
            line = self.lines.get()
            if line == "configured\n":
                self.configured = True
            elif line.startswith("ended "):
                self.ended = json.loads(line.removeprefix("ended "))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self._reader.join(120)
        self.poll()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def seed_agents(session: AsyncSession, tokens: list[tuple[str, int]]) -> None:
    """Agents (token, agent id) in projects of ten, in one transaction: one hub call per agent took 0.2 s."""
    root, namespace = await root_namespace(session)
    for project_id in sorted({agent_id // 10 for _, agent_id in tokens}):
        session.add(root_project(root, namespace, project_id))
    await session.flush()
    session.add_all(ClusterAgent(id=agent_id, project_id=agent_id // 10, name=f"a{agent_id}") for _, agent_id in tokens)
    await session.flush()
    session.add_all(
        ClusterAgentToken(agent_id=agent_id, name="bench", token_digest=hashlib.sha256(token.encode()).hexdigest())
        for token, agent_id in tokens
    )
    await session.flush()


async def gauge(kas: KasProc, name: str) -> float:
    """A gauge of kas' metrics; -1 while kas is too busy to answer (during the connection storm)."""
    try:
        return await asyncio.to_thread(kas.gauge, name)
    except (OSError, KeyError):
        return -1.0


def serve_hub(directory: Path, seeded: RealHub, database_url: str) -> tuple[ManagedProcess, RealHub]:
    """``tether hub serve`` on the seeded database, with the seeding hub's secret; the RealHub is its address."""
    port = free_port()
    config = directory / "hub-serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{port}",
                "data_dir": str(directory),
                "database": {"url": database_url, "auto_migrate": False},
                "gitlab": {"authentication_secret_file": str(seeded.secret_file)},
                "logging": {"level": "warn"},
                "security": {"failed_auth_per_source_per_minute": 0},
            }
        )
    )
    process = ManagedProcess("hub", [TETHER, "hub", "--config", str(config), "serve"], directory / "hub-serve.log")
    process.start()
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(lambda: http_get(f"{url}/-/health")[0] == 200, 60, "healthy")
    return process, dataclasses.replace(seeded, url=url)


def redis_info(sentinel: SentinelRedis) -> dict[str, Any]:
    master = sentinel.master
    with redis.Redis(host=HOST, port=master.port or 0, password=sentinel.password) as client:
        info: dict[str, Any] = client.info()
    return info


def commands_per_second(sentinel: SentinelRedis, seconds: float) -> tuple[float, float]:
    """(commands per second over ``seconds``, used memory in MiB at the end) on the master."""
    first = redis_info(sentinel)
    time.sleep(seconds)
    last = redis_info(sentinel)
    rate = (last["total_commands_processed"] - first["total_commands_processed"] - 2) / seconds
    return rate, last["used_memory"] / 1024 / 1024


async def run(count: int, calls: int) -> dict[str, tuple[float, str]]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tether-bench-kas3-") as tmp:
        directory = Path(tmp)
        postgres = PostgresServer(directory / "postgres").start()
        sentinel = SentinelRedis(directory / "sentinel").start()
        postgres.create_database("hub")
        database_url = postgres.sqlalchemy_url_for("hub")
        (directory / "hub").mkdir()
        launcher = HubLauncher(directory / "hub", database_url)
        seeding = launcher.launch({"logging.level": "info", "security.failed_auth_per_source_per_minute": 0})
        per_kas = [count // KAS + (1 if i < count % KAS else 0) for i in range(KAS)]
        prefixes = [f"kas3-{i}-{time.monotonic_ns()}-" for i in range(KAS)]
        bench_tokens = [(f"kas3-bench-{index}-{time.monotonic_ns()}", 900 + index) for index in range(KAS)]
        tokens = [
            (f"{prefix}{j}", 300_000 + i * 100_000 + j)
            for i, (prefix, n) in enumerate(zip(prefixes, per_kas, strict=True))
            for j in range(n)
        ]
        seeded = time.monotonic()
        seeding.db.session(lambda session: seed_agents(session, bench_tokens + tokens))
        print(f"{count} agents seeded in the hub in {time.monotonic() - seeded:.0f} s", flush=True)
        launcher.stop_all()
        # The hub serves from a process of its own: in a thread of this process it shared the interpreter lock
        # with the benchmark and answered agent_info after kas' 20 s timeout during the connection storm.
        hub_process, hub = serve_hub(directory / "hub", seeding, database_url)
        system = System(directory, hub, write_private_secret(directory / "private_secret"), None, None)
        agents = BenchAgents(directory)
        sims: list[Simulator] = []
        try:
            redis_config = {**sentinel.kas_redis_config(directory), "key_prefix": "kas3"}
            kas = [
                system.kas(use_redis=False, redis=redis_config, agent={"configuration": {"poll_period": "3600s"}})
                for _ in range(KAS)
            ]
            bench_ids = []
            for k, (token, agent_id) in zip(kas, bench_tokens, strict=True):
                agents.connect(token, k)
                await agents.connected_at(token)
                bench_ids.append(agent_id)
            idle_cps, idle_mib = await asyncio.to_thread(commands_per_second, sentinel, 10.0)

            began = time.monotonic()
            sims = [Simulator(k, prefix, n) for k, prefix, n in zip(kas, prefixes, per_kas, strict=True)]
            connected_s = 0.0
            deadline = began + 1200
            while not connected_s:
                if time.monotonic() > deadline:
                    raise RuntimeError("the agents did not all connect within 20 minutes")
                for sim in sims:
                    sim.poll()
                idle = [await gauge(k, "tunnels_idle") for k in kas]
                if all(s.configured for s in sims) and all(t >= 2 * n for t, n in zip(idle, per_kas, strict=True)):
                    connected_s = time.monotonic() - began
                await asyncio.sleep(0.5)
            print(f"every agent connected after {connected_s:.1f} s", flush=True)
            await asyncio.sleep(10)  # settle

            steady_cps, steady_mib = await asyncio.to_thread(commands_per_second, sentinel, STEADY_S)
            rss = [rss_kib(k.process.pid) / 1024 for k in kas if k.process is not None]
            routed: list[float] = []
            same: list[float] = []
            for index, k in enumerate(kas):
                for other, agent_id in enumerate(bench_ids):
                    caller = Caller(k, hub.secret, agent_id)
                    samples = await caller.latency_ms(calls)
                    await caller.close()
                    (same if other == index else routed).extend(samples)
            agents_seen = await gauge(kas[0], "connected_agents_count")
        finally:
            for sim in sims:
                sim.stop()
            agents.stop()
            system.stop_all()
            hub_process.stop()
            sentinel.stop()
            postgres.stop()
    load_after = os.getloadavg()
    if any(sim.ended is None for sim in sims):  # a simulator that did not finish its count: 0 would be a guess
        raise RuntimeError("an agent simulator exited without its re-open count")
    reopens: dict[str, int] = {}
    for sim in sims:
        for key, value in (sim.ended or {}).items():
            reopens[key] = reopens.get(key, 0) + value
    print(f"stream re-opens: {reopens}; connected_agents_count: {agents_seen:.0f}")
    figures: dict[str, tuple[float, str]] = {
        "kas3_10000_agents_connect_seconds": (connected_s, "s"),
        "kas3_10000_agents_rss_mib_max": (max(rss), "MiB"),
        **{f"kas3_10000_agents_rss_mib_kas{i + 1}": (value, "MiB") for i, value in enumerate(rss)},
        "kas3_routed_p50_ms": (statistics.median(routed), "ms"),
        "kas3_routed_p99_ms": (percentile(routed, 99), "ms"),
        "kas3_same_kas_p50_ms": (statistics.median(same), "ms"),
        "kas3_same_kas_p99_ms": (percentile(same, 99), "ms"),
        "kas3_redis_used_memory_mib": (steady_mib, "MiB"),
        "kas3_redis_used_memory_mib_no_agents": (idle_mib, "MiB"),
        "kas3_redis_commands_per_second": (steady_cps, "1/s"),
        "kas3_redis_commands_per_second_no_agents": (idle_cps, "1/s"),
        "kas3_stream_reopens": (float(sum(reopens.values())), "count"),
        "kas3_load_average_before": (load_before[0], "load"),
        "kas3_load_average_after": (load_after[0], "load"),
    }
    if count != 10_000:
        figures = {name.replace("10000", str(count)): value for name, value in figures.items()}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000, help="simulated agents, spread over the three kas")
    parser.add_argument("--calls", type=int, default=300, help="routed calls per (kas, benchmark agent) pair")
    args = parser.parse_args()
    figures = asyncio.run(run(args.agents, args.calls))
    for name, (value, unit) in figures.items():
        print(f"{name:44s} {value:10.2f} {unit}")
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    results = [r for r in kept if r["metric"] not in figures]
    results += [{"metric": k, "value": round(v, 2), "unit": u} for k, (v, u) in figures.items()]
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
