"""Hardening benchmarks (issue 9): back-pressure, refresh at 20,000 connections, chaos, 10,000 agents.

Usage: ``uv run python bench/hardening.py [--agents N] [--part all|tests|agents|freeze] [--runs N] [--no-dev-venv]
[--upstream-runs N]``

The first three figures come from the tests that check them, run here through pytest with
``TETHER_BENCH_DIR`` set so they write their measurements:

- ``slow_client_kas_rss_growth_mib``: the largest kas RSS growth (either kas) while a client does not read
  a 100 MiB response, over same kas / cross kas, plain / upgraded (``tests/e2e/test_back_pressure.py``);
- ``refresh_20000_connections_seconds``: one refresh of 20,000 simulated connections (agent tracker and
  tunnel tracker) on real Redis (``tests/integration/test_redis_state.py``);
- ``chaos_recovery_seconds`` (worst of the three disruptions) and ``chaos_failed_requests``
  (``tests/e2e/test_chaos.py``);
- ``continuation_flood_rss_per_connection_mib`` behind the front proxy (HAProxy) and
  ``front_proxy_added_latency_ms`` (``tests/e2e/test_front_proxy.py``).

The 10,000-agent figures are measured here: one kas on a private Redis, and ``bench/sim_agents.py`` holding
N agents with one HTTP/2 connection each (as real agentk connects), each with a configuration stream and two
idle tunnels. ``connect_10000_agents_seconds`` runs from the simulator's start until every agent's
configuration stream has brought its first configuration (what agentk's readiness waits for) and kas holds
every tunnel idle (kas' ``connected_agents_count`` is not used: it is refreshed from Redis every 5 s);
``kas_rss_10000_agents_mib`` is kas' RSS 10 s later; ``stream_reopens_10000_agents`` counts the streams the
agents re-opened during the run, configuration streams and tunnels, whatever ended them (an error or a normal
end). kas runs as an image carries it (the runtime package installed without
extras into an empty virtual environment, as in ``bench/footprint.py``); the same three figures with the
development environment's kas are recorded beside them with the suffix ``_dev_venv``.
The runtime kas' run is repeated ``--runs`` times (default 3; issue 28 item 5: the spread, not the best):
the median of each figure is recorded, with ``connect_10000_agents_seconds_min`` and ``_max``; every run
prints the load average before it and the CPU seconds of kas, of this process (the hub runs in a thread of
it) and of the simulator during the storm, and records ``kas_storm_cpu_ms_per_agent`` and
``storm_load_average`` (1-minute). ``--no-dev-venv`` skips the development environment's run.
``--upstream-runs N`` runs the same storm N times against upstream kas 16.5 (the peer, built by ``tether dev
upstream build``) on the same hub (with its Gitaly-compatible service, which upstream kas reads configurations
from), Redis and simulator, and records its figures with the suffix ``_upstream`` (median; ``_min``/``_max`` for the
connect time). Its client-side limits on GitLab and Gitaly calls (50 and 15 a second by default) are lifted, so the
storm measures upstream kas, not them. Upstream kas has no ``tunnels_idle`` gauge: its tunnels count as there once its
``grpc_server_requests_in_flight`` shows every ``Connect`` call open.

``redis_freeze_gateway_requests_ratio`` (issue 27 item 5, ``--part freeze``): one kas on a private Redis with
one agentk connected to it (the endpoint behind agentk answers a bare 404) and :data:`FREEZE_CLIENTS` clients
sending ``GET /version?timeout=2s`` through kas' Kubernetes API proxy back to back (client deadline 3 s). The
requests that reached the endpoint within their deadline during 30 s of Redis stopped with SIGSTOP, over those
of the 30 s before. Writes ``bench/results/hardening.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import aiohttp
import yaml

from tests.e2e.test_k8s_proxy_upgrade import agent_kubeconfig, client_tls
from tests.fixtures import system as system_fixture
from tests.fixtures.hub import RealHub, RunningHub
from tests.fixtures.system import KAS_DEFAULT_CACHING, KasProc, System, write_private_secret
from tests.support.runtime_venv import build_runtime_venv
from tether_devenv import pki, upstream
from tether_devenv.process import ManagedProcess, free_port, free_ports
from tether_devenv.redis_server import RedisServer

HERE = Path(__file__).parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "hardening.json"
DEV_TETHER = system_fixture.TETHER
TESTS = [
    "tests/e2e/test_back_pressure.py",
    "tests/integration/test_redis_state.py::test_20000_connections_refresh_while_routed_reads_stay_fast",
    "tests/e2e/test_chaos.py",
    "tests/e2e/test_front_proxy.py",
]


FREEZE_CLIENTS = 8
FREEZE_WINDOW_S = 30.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used so far, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def tunnels(kas: KasProc, upstream_kas: bool) -> float:
    """Tether kas' idle tunnels (``tunnels_idle``: descriptor received, waiting for a call), as every earlier record
    counted them; upstream kas has no such gauge: its open ``Connect`` calls (:func:`open_tunnels`). -1 while kas is
    too busy to answer."""
    if not upstream_kas:
        return await gauge(kas, "tunnels_idle")
    try:
        return await asyncio.to_thread(open_tunnels, kas)
    except OSError:
        return -1.0


async def gauge(kas: KasProc, name: str) -> float:
    """A gauge of kas' metrics; -1 while kas is too busy to answer (during the connection storm)."""
    try:
        return await asyncio.to_thread(kas.gauge, name)
    except (OSError, KeyError):
        return -1.0


def from_tests(directory: Path) -> dict[str, tuple[float, str]]:
    """Run the measuring tests with ``TETHER_BENCH_DIR`` and read back what they wrote."""
    env = dict(os.environ, TETHER_BENCH_DIR=str(directory))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", *TESTS]
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    growth = 0.0
    for path in directory.glob("back_pressure_*.json"):
        figures = json.loads(path.read_text())
        growth = max(growth, figures["growth_mib"]["kas1"], figures["growth_mib"]["kas2"])
        print(f"{path.stem}: {figures}")
    refresh = json.loads((directory / "refresh_20000.json").read_text())
    chaos = json.loads((directory / "chaos.json").read_text())
    front_proxy = json.loads((directory / "front_proxy.json").read_text())
    print(f"refresh: {refresh}\nchaos: {chaos}\nfront proxy: {front_proxy}")
    return {
        "slow_client_kas_rss_growth_mib": (growth, "MiB"),
        "refresh_20000_connections_seconds": (refresh["refresh_s"], "s"),
        "chaos_recovery_seconds": (max(chaos["recovery_s"].values()), "s"),
        "chaos_failed_requests": (chaos["failed_requests"], "count"),
        "continuation_flood_rss_per_connection_mib": (front_proxy["continuation_flood_rss_per_connection_mib"], "MiB"),
        "front_proxy_added_latency_ms": (front_proxy["front_proxy_added_latency_ms"], "ms"),
    }


def start_upstream_kas(system: System, hub: RealHub, redis: RedisServer) -> KasProc:
    """Upstream kas 16.5 (built by ``tether dev upstream build``) on the same hub and Redis, with its defaults.

    Only its agent, api, private api and observability listeners, and its rate limits on GitLab and Gitaly calls
    lifted; it reads agent configurations through the hub's Gitaly-compatible service (docs/interop.md), so the hub
    must have been started with ``gitaly.listen``.
    """
    directory = system.directory / "upstream-kas"
    directory.mkdir()
    names = ("agent", "api", "private_api", "observability")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    config: dict[str, Any] = {
        "gitlab": {"address": hub.url, "authentication_secret_file": str(hub.secret_file)},
        "agent": {"listen": {"address": f"127.0.0.1:{ports['agent']}"}},
        "observability": {"listen": {"address": f"127.0.0.1:{ports['observability']}"}},
        "api": {"listen": {"address": f"127.0.0.1:{ports['api']}", "authentication_secret_file": str(hub.secret_file)}},
        "private_api": {
            "listen": {
                "address": f"127.0.0.1:{ports['private_api']}",
                "authentication_secret_file": str(system.private_secret_file),
            }
        },
        "redis": {"server": {"address": f"127.0.0.1:{redis.port}"}, "key_prefix": "upstream"},
    }
    # Upstream's client-side rate limits on GitLab (50 calls/s) and Gitaly (15 calls/s per server) would make the
    # storm a measure of them: 300 agents took 38 s with them, about two Gitaly calls per configuration. Lifted, so
    # the run shows what upstream kas itself spends (Tether kas has no per-second limit on hub calls).
    unlimited = {"refill_rate_per_second": 1_000_000.0, "bucket_size": 1_000_000}
    config["gitlab"]["api_rate_limit"] = unlimited
    config["gitaly"] = {"global_api_rate_limit": unlimited, "per_server_api_rate_limit": unlimited}
    path = directory / "kas.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [str(upstream.locate().kas), "--configuration-file", str(path)]
    kas = KasProc(
        "upstream-kas", directory, ports, config, ManagedProcess("upstream-kas", command, directory / "kas.log")
    )
    assert kas.process is not None
    system.started.append(kas)  # stopped with the rest by ``system.stop_all()``
    kas.process.start()
    kas.process.wait_ready(lambda: kas.readiness()[0] == 200, 60, "ready", ports["observability"])
    return kas


def open_tunnels(kas: KasProc) -> float:
    """Tunnels (``ReverseTunnel.Connect`` calls) kas serves now: ``grpc_server_requests_in_flight``, which upstream kas
    and Tether kas both export under the same name and labels."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in kas.metrics().splitlines()
        if line.startswith("grpc_server_requests_in_flight{") and 'grpc_method="Connect"' in line
    )


async def many_agents(count: int, tether: str | None, suffix: str) -> dict[str, tuple[float, str]]:
    """kas with ``count`` simulated agents, one HTTP/2 connection each: Tether kas (the ``tether`` executable
    given) or, with ``tether`` None, upstream kas 16.5 on the same hub, Redis and simulator (issue 28: the peer)."""
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        directory = Path(tmp)
        if tether is not None:
            system_fixture.TETHER = tether
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(
            directory / "hub", {"gitaly.listen": f"127.0.0.1:{free_port()}"} if tether is None else None
        )
        hub = running.hub
        system = System(directory, hub, write_private_secret(directory / "private_secret"), None, redis)
        prefix = f"many{time.monotonic_ns()}-"
        for i in range(count):
            hub.add_agent(f"{prefix}{i}", 300_000 + i, 400_000 + i // 10)
        try:
            kas = system.kas(**KAS_DEFAULT_CACHING) if tether is not None else start_upstream_kas(system, hub, redis)
            assert kas.process is not None
            load = os.getloadavg()
            kas_cpu_before, own_cpu_before = cpu_s(kas.process.pid), cpu_s(os.getpid())
            began = time.monotonic()
            target = kas.agent_address.removeprefix("grpc://")
            sim = subprocess.Popen(
                [sys.executable, str(HERE / "sim_agents.py"), target, prefix, str(count), "1"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert sim.stdin is not None and sim.stdout is not None
            lines: queue.Queue[str] = queue.Queue()
            reader = threading.Thread(target=lambda: [lines.put(line) for line in sim.stdout or ()], daemon=True)
            reader.start()
            configured_s = tunnels_s = polled = 0.0
            ended: dict[str, int] | None = None
            try:
                deadline = began + 600
                while not (configured_s and tunnels_s):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"agents did not all connect: {await tunnels(kas, tether is None)} tunnels")
                    while not lines.empty():
                        if lines.get() == "configured\n":
                            configured_s = time.monotonic() - began
                    # kas' /metrics lists its open file descriptors (one per agent): read 5 times a second it cost
                    # kas 5 % of its CPU during a 2,000-agent storm (py-spy), so once a second (issue 28 item 5).
                    if not tunnels_s and time.monotonic() >= polled + 1.0:
                        polled = time.monotonic()
                        if await tunnels(kas, tether is None) >= 2 * count:
                            tunnels_s = time.monotonic() - began
                    await asyncio.sleep(0.2)
                connect_s = max(configured_s, tunnels_s)
                # CPU of the storm: kas; the hub (a thread of this process, with this loop's polling); the agents.
                storm_cpu = {
                    "kas": cpu_s(kas.process.pid) - kas_cpu_before,
                    "hub+bench": cpu_s(os.getpid()) - own_cpu_before,
                    "simulator": cpu_s(sim.pid),
                }
                print(
                    f"every agent configured after {configured_s:.1f} s, every tunnel idle after {tunnels_s:.1f} s; "
                    f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; CPU s of the storm: "
                    + ", ".join(f"{name} {value:.1f}" for name, value in storm_cpu.items())
                )
                await asyncio.sleep(10)  # settle: anything that breaks shows as re-opened streams
                rss = rss_mib(kas.process.pid)
                agents_seen = await gauge(kas, "connected_agents_count")  # upstream's name too
            finally:
                sim.stdin.close()
                reader.join(120)
                while not lines.empty():
                    line = lines.get()
                    if line.startswith("ended "):
                        ended = json.loads(line.removeprefix("ended "))
                sim.wait(120)
            # No "ended" line means the simulator did not finish its count: 0 re-opens would be a guess.
            if ended is None or sim.returncode != 0:
                raise RuntimeError(f"the agent simulator exited with {sim.returncode} without its re-open count")
            log = (kas.directory / "kas.log").read_text()
            redis_failures = sum(word in log for word in ("MaxConnectionsError", "Too many connections"))
        finally:
            system.stop_all()
            running.stop()
            redis.stop()
    print(
        f"re-opened streams by kind and status: {ended}; Redis pool failures in the kas log: {redis_failures}; "
        f"kas' connected_agents_count (refreshed from Redis every 5 s) then: {agents_seen:.0f}"
    )
    return {
        f"kas_rss_{count}_agents_mib{suffix}": (rss, "MiB"),
        f"connect_{count}_agents_seconds{suffix}": (connect_s, "s"),
        f"stream_reopens_{count}_agents{suffix}": (sum(ended.values()), "count"),
        f"kas_storm_cpu_ms_per_agent{suffix}": (storm_cpu["kas"] * 1000 / count, "ms"),
        f"storm_load_average{suffix}": (load[0], "load"),
    }


def spread(runs: list[dict[str, tuple[float, str]]]) -> dict[str, tuple[float, str]]:
    """Median of each figure over ``runs``; for the connect time also the slowest and fastest run (issue 28 item 5)."""
    figures: dict[str, tuple[float, str]] = {}
    for name, (_, unit) in runs[0].items():
        values = sorted(run[name][0] for run in runs)
        figures[name] = (statistics.median(values), unit)
        if name.startswith("connect_") and len(runs) > 1:
            figures[f"{name}_min"] = (values[0], unit)
            figures[f"{name}_max"] = (values[-1], unit)
    if len(runs) > 1:
        figures["many_agents_runs"] = (len(runs), "runs")
    return figures


async def not_found_endpoint() -> asyncio.Server:
    """The cluster behind agentk: a bare 404 for everything."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def proxied(session: aiohttp.ClientSession, kas: KasProc, agent_id: int, pat: str) -> bool:
    """One request through kas to the agent; True when the endpoint answered within the deadline."""
    try:
        async with session.get(
            kas.k8s_proxy_url + "version?timeout=2s",
            headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"},
            timeout=aiohttp.ClientTimeout(total=3.0),
        ) as response:
            return response.status == 404 and await response.read() == b""
    except (aiohttp.ClientError, TimeoutError):
        return False


async def redis_freeze() -> dict[str, tuple[float, str]]:
    """Requests served by the gateway kas during a 30 s Redis SIGSTOP over those of the 30 s before."""
    with tempfile.TemporaryDirectory(prefix="tether-bench-freeze-") as tmp:
        directory = Path(tmp)
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(directory / "hub")
        hub = running.hub
        tls = pki.generate(directory / "pki")
        system = System(directory, hub, write_private_secret(directory / "private_secret"), None, redis, tls)
        endpoint = await not_found_endpoint()
        agent_id, pat, token = 880_001, "glpat-bench-freeze", f"bench-freeze-{time.monotonic_ns()}"
        hub.add_agent(token, agent_id, 880_000, "freeze")
        hub.grant_proxy_access(pat, "robot", agent_id, 880_000)
        frozen = False
        try:
            kas = await asyncio.to_thread(system.kas)
            port = endpoint.sockets[0].getsockname()[1]
            kubeconfig = agent_kubeconfig(directory / "agent.kubeconfig", f"http://127.0.0.1:{port}", "sa")
            system.agentk(token, kas, "freeze", kubeconfig=kubeconfig)
            ends: list[tuple[float, bool]] = []
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas))) as session:
                deadline = time.monotonic() + 60
                while not await proxied(session, kas, agent_id, pat):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the agent never became reachable")
                    await asyncio.sleep(0.5)
                began = time.monotonic()
                freeze_at = began + FREEZE_WINDOW_S
                stop_at = freeze_at + FREEZE_WINDOW_S

                async def client() -> None:
                    while time.monotonic() < stop_at:
                        ok = await proxied(session, kas, agent_id, pat)
                        ends.append((time.monotonic(), ok))

                clients = asyncio.gather(*(client() for _ in range(FREEZE_CLIENTS)))
                await asyncio.sleep(freeze_at - time.monotonic())
                os.kill(redis.pid, signal.SIGSTOP)
                frozen = True
                await clients
                os.kill(redis.pid, signal.SIGCONT)
                frozen = False
        finally:
            if frozen:
                os.kill(redis.pid, signal.SIGCONT)
            endpoint.close()
            system.stop_all()
            running.stop()
            redis.stop()
    before = sum(ok for end, ok in ends if began <= end < freeze_at)
    during = sum(ok for end, ok in ends if freeze_at <= end <= stop_at)
    failed = sum(not ok for end, ok in ends if freeze_at <= end <= stop_at)
    print(f"Redis freeze: {before} requests served in the 30 s before, {during} during ({failed} failed)")
    return {"redis_freeze_gateway_requests_ratio": (during / before, "ratio")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000, help="simulated agents, one connection each")
    parser.add_argument(
        "--part",
        choices=["all", "tests", "agents", "freeze"],
        default="all",
        help="measure one part only: test figures, many agents or Redis freeze (the others in the file are kept)",
    )
    parser.add_argument("--runs", type=int, default=3, help="10,000-agent runs of the runtime kas (median recorded)")
    parser.add_argument("--no-dev-venv", action="store_true", help="skip the development environment's kas run")
    parser.add_argument(
        "--upstream-runs",
        type=int,
        default=0,
        help="also run the storm this many times against upstream kas 16.5 (the peer; figures with suffix _upstream)",
    )
    args = parser.parse_args()
    figures: dict[str, tuple[float, str]] = {}
    if args.part in ("all", "tests"):
        with tempfile.TemporaryDirectory(prefix="tether-bench-figures-") as tmp:
            figures.update(from_tests(Path(tmp)))
    if args.part in ("all", "agents"):
        # kas as an image carries it (the runtime package without extras, as bench/footprint.py), then the
        # development environment's, where PyJWT and structlog also load cryptography and rich.
        with tempfile.TemporaryDirectory(prefix="tether-bench-runtime-") as tmp:
            runtime = str(build_runtime_venv(Path(tmp)) / "bin" / "tether")
            runs = [asyncio.run(many_agents(args.agents, runtime, "")) for _ in range(args.runs)]
            for number, run in enumerate(runs, 1):
                print(f"run {number}: " + ", ".join(f"{name} {value:.2f}" for name, (value, _) in run.items()))
            figures.update(spread(runs))
        if not args.no_dev_venv:
            figures.update(asyncio.run(many_agents(args.agents, DEV_TETHER, "_dev_venv")))
        if args.upstream_runs:
            peer = [asyncio.run(many_agents(args.agents, None, "_upstream")) for _ in range(args.upstream_runs)]
            for number, run in enumerate(peer, 1):
                print(f"upstream run {number}: " + ", ".join(f"{name} {value:.2f}" for name, (value, _) in run.items()))
            figures.update({name: value for name, value in spread(peer).items() if name != "many_agents_runs"})
    if args.part in ("all", "freeze"):
        figures.update(asyncio.run(redis_freeze()))
    for name, (value, unit) in figures.items():
        print(f"{name:36s} {value:10.2f} {unit}")
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() and args.part != "all" else []
    results = [r for r in kept if r["metric"] not in figures]
    results += [{"metric": k, "value": round(v, 2), "unit": u} for k, (v, u) in figures.items()]
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
