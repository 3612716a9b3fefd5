"""A rolling update of three kas behind a load balancer fails no request (issue 26 item 3).

Three kas on one Redis behind HAProxy (``tests/fixtures/kas_balancer.py``): three agentk processes connect
through it, 20 clients send requests through it to the Kubernetes API proxy (18 loops of small GETs, 2 watches
that watch again whenever their watch ends cleanly, as kubectl and informers do). Each kas in turn gets SIGTERM,
exits and is started again. Counted as failed: a GET that did not get the answer of the endpoint behind agentk,
a watch cut without its terminating chunk, a watch that could not be opened again. Required: none.

The figures go to ``$TETHER_BENCH_DIR/rolling_restart.json`` when set (``bench/rolling_restart.py``).

The load balancer spreads each agent's tunnels over the kas, so most agents are on another kas already when
theirs stops; the second test stops the only kas an agent has tunnels on, so it must move (docs/deployment.md
"Rolling updates of kas").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_k8s_proxy_upgrade import agent_kubeconfig
from tests.fixtures.bulk_endpoint import Bulk
from tests.fixtures.hub import RealHub
from tests.fixtures.kas_balancer import KasBalancer, start_kas_balancer
from tests.fixtures.system import K8S_PROXY_PREFIX, AgentkProc, KasProc, System

pytestmark = [pytest.mark.redis]

AGENTS = 3
GET_CLIENTS, WATCH_CLIENTS = 18, 2
#: kas gives up finding a tunnel after the request's ``timeout``; the client after this many seconds.
REQUEST_DEADLINE_S = 15.0
#: Load before the first and after the last restart, and between restarts once the restarted kas is ready.
SETTLE_S = 2.0
#: ``routing.shutdown_grace_period`` of the kas: a watch through a stopping gateway kas ends after it.
GRACE_S = 4.0
_ids = itertools.count(9301)


@dataclass
class Tally:
    gets: int = 0
    failed_gets: int = 0
    watches_opened: int = 0
    watches_ended_cleanly: int = 0
    failed_watches: int = 0
    failures: list[str] = field(default_factory=list)
    longest_get_s: float = 0.0

    @property
    def failed(self) -> int:
        return self.failed_gets + self.failed_watches


def _auth(agent_id: int) -> dict[str, str]:
    return {"Authorization": f"Bearer pat:{agent_id}:glpat-rolling-{agent_id}"}


async def _get(session: aiohttp.ClientSession, base: str, agent_id: int) -> str | None:
    """One small GET; None when the endpoint behind agentk answered (an empty 404), else what went wrong."""
    try:
        async with session.get(
            base + "version?timeout=10s",
            headers=_auth(agent_id),
            timeout=aiohttp.ClientTimeout(total=REQUEST_DEADLINE_S),
        ) as response:
            body = await response.read()
            if response.status == 404 and body == b"":
                return None
            return f"GET: {response.status} {body[:200]!r}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"GET: {exc!r}"


async def _get_loop(tally: Tally, base: str, agent_id: int, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.monotonic()
            failure = await _get(session, base, agent_id)
            tally.longest_get_s = max(tally.longest_get_s, time.monotonic() - started)
            tally.gets += 1
            if failure is not None:
                tally.failed_gets += 1
                tally.failures.append(failure)
            await asyncio.sleep(0.05)


async def _watch_loop(tally: Tally, base: str, agent_id: int, stop: asyncio.Event) -> None:
    """Watch, and watch again whenever the watch ends with its terminating chunk (client-go's behaviour)."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            try:
                async with session.get(
                    base + "api/v1/pods?watch=true",
                    headers=_auth(agent_id),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_DEADLINE_S),
                ) as response:
                    if response.status != 200:
                        tally.failed_watches += 1
                        tally.failures.append(f"watch: {response.status} {(await response.read())[:200]!r}")
                        await asyncio.sleep(0.5)
                        continue
                    tally.watches_opened += 1
                    reading = asyncio.ensure_future(_drain(response))
                    stopped = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    stopped.cancel()
                    if not reading.done():
                        reading.cancel()
                        return
                    reading.result()  # a cut raises ClientPayloadError
                    tally.watches_ended_cleanly += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.failed_watches += 1
                tally.failures.append(f"watch: {exc!r}")
                await asyncio.sleep(0.5)


async def _drain(response: aiohttp.ClientResponse) -> None:
    while await response.content.readline():
        pass


async def _connect_agents(
    system: System, kas_hub: RealHub, bulk: Bulk, balancer: KasBalancer, tmp_path: Path, count: int = AGENTS
) -> list[int]:
    agents = []
    for _ in range(count):
        agent_id = next(_ids)
        token = f"rolling-agent-{agent_id}-{time.monotonic_ns()}"
        kas_hub.add_agent(token, agent_id, 75, f"rolling-{agent_id}")
        kubeconfig = agent_kubeconfig(tmp_path / f"a{agent_id}.kubeconfig", f"http://127.0.0.1:{bulk.port}", "sa")
        system.agentk_at(token, balancer.agent_address, f"rolling-{agent_id}", kubeconfig=kubeconfig)
        kas_hub.grant_proxy_access(f"glpat-rolling-{agent_id}", "robot", agent_id, 75)
        agents.append(agent_id)
    return agents


def _tunnel_failures(system: System, since: float, until: float) -> list[str]:
    return [f for proc in system.started if isinstance(proc, AgentkProc) for f in proc.tunnel_failures(since, until)]


async def _restart(system: System, kas: KasProc, agents: list[int]) -> tuple[float, int]:
    """SIGTERM ``kas``, wait for its exit, start it again.

    Returns the seconds it took to exit, and the tunnel tracker entries that still named it once it had exited
    (it removes them itself before it exits: none may be left to expire).
    """
    kas.signal(signal.SIGTERM)
    began = time.monotonic()
    await asyncio.to_thread(kas.wait_exit, 60.0)
    exited_s = time.monotonic() - began
    left = [a for a in agents if kas.private_url in await system.tunnel_urls(a)]
    await asyncio.to_thread(kas.start)
    return exited_s, len(left)


async def rolling_restart(system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path) -> dict[str, object]:
    """Run the scenario of the module docstring; return its figures."""
    overrides = {
        "routing": {"shutdown_grace_period": f"{GRACE_S:g}s"},
        # Still accepting agentk for a moment after SIGTERM, as in a deployment (default 5 s).
        "agent": {"listen": {"listen_grace_period": "1s"}},
    }
    kas = [system.kas(**overrides) for _ in range(3)]
    assert system.proxy_tls is not None
    balancer = start_kas_balancer([k.ports for k in kas], system.proxy_tls.ca_cert, tmp_path / "balancer")
    try:
        agents = await _connect_agents(system, kas_hub, bulk, balancer, tmp_path)
        base = balancer.k8s_proxy_url(K8S_PROXY_PREFIX)
        async with aiohttp.ClientSession() as session:
            for agent_id in agents:
                deadline = time.monotonic() + 60
                while await _get(session, base, agent_id) is not None:
                    assert time.monotonic() < deadline, f"agent {agent_id} never became reachable"
                    await asyncio.sleep(0.3)
        tally = Tally()
        stop = asyncio.Event()
        clients = [
            *(_get_loop(tally, base, agents[i % AGENTS], stop) for i in range(GET_CLIENTS)),
            *(_watch_loop(tally, base, agents[i % AGENTS], stop) for i in range(WATCH_CLIENTS)),
        ]
        load = asyncio.gather(*clients)
        began = time.monotonic()
        exit_s = []
        left_in_tracker = 0
        try:
            await asyncio.sleep(SETTLE_S)
            restarts_began = time.time()
            for victim in kas:
                exited_s, left = await _restart(system, victim, agents)
                exit_s.append(round(exited_s, 2))
                left_in_tracker += left
                await asyncio.sleep(SETTLE_S)
            restarts_ended = time.time()
        finally:
            stop.set()
            await load
        duration_s = time.monotonic() - began
        tunnel_failures = _tunnel_failures(system, restarts_began, restarts_ended)
    finally:
        balancer.stop()
    return {
        "kas": len(kas),
        "agents": AGENTS,
        "clients": GET_CLIENTS + WATCH_CLIENTS,
        "duration_s": round(duration_s, 1),
        "requests": tally.gets + tally.watches_opened,
        "rolling_restart_failed_requests": tally.failed,
        "failed_gets": tally.failed_gets,
        "failed_watches": tally.failed_watches,
        "watches_ended_cleanly": tally.watches_ended_cleanly,
        "longest_get_s": round(tally.longest_get_s, 2),
        "kas_exit_s": exit_s,
        "agent_tunnel_failures": len(tunnel_failures),
        "tracker_entries_left_by_stopped_kas": left_in_tracker,
        "failures": (tally.failures + tunnel_failures)[:20],
    }


async def test_rolling_restart_of_three_kas_fails_no_request(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    figures = await rolling_restart(system, kas_hub, bulk, tmp_path)
    print(json.dumps(figures, indent=2))
    if bench_dir := os.environ.get("TETHER_BENCH_DIR"):
        await asyncio.to_thread((Path(bench_dir) / "rolling_restart.json").write_text, json.dumps(figures))
    assert figures["rolling_restart_failed_requests"] == 0, figures["failures"]
    assert figures["longest_get_s"] <= REQUEST_DEADLINE_S, "a request outlived its deadline"
    # Agents moved make-before-break: no tunnel of theirs failed (each failure means a reconnect backoff).
    assert figures["agent_tunnel_failures"] == 0, figures["failures"]
    assert figures["tracker_entries_left_by_stopped_kas"] == 0


async def test_an_agent_on_the_stopping_kas_only_moves_before_its_tunnels_there_end(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    """All of the agent's tunnels are on kas 1 when it gets SIGTERM: one ends, agentk reopens it on kas 2 (through
    the load balancer), kas 2 announces it, and kas 1 ends the rest and exits, long before ``agent_move_timeout``;
    requests sent meanwhile all succeed."""
    move_timeout_s = 20.0
    overrides = {"routing": {"shutdown_grace_period": "30s", "agent_move_timeout": f"{move_timeout_s:g}s"}}
    kas1, kas2 = system.kas(**overrides), system.kas(**overrides)
    kas2.stop()  # down while the agent connects: every tunnel lands on kas 1
    assert system.proxy_tls is not None
    balancer = start_kas_balancer([kas1.ports, kas2.ports], system.proxy_tls.ca_cert, tmp_path / "balancer")
    try:
        [agent_id] = await _connect_agents(system, kas_hub, bulk, balancer, tmp_path, count=1)
        base = balancer.k8s_proxy_url(K8S_PROXY_PREFIX)
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while await _get(session, base, agent_id) is not None:
                assert time.monotonic() < deadline, "the agent never became reachable"
                await asyncio.sleep(0.3)
        await asyncio.to_thread(kas2.start)
        assert await system.tunnel_urls(agent_id) == [kas1.private_url]
        # Requests start with the SIGTERM: each uses up a tunnel, whose replacement could land on kas 2 earlier.
        tally, stop = Tally(), asyncio.Event()
        load = asyncio.gather(*(_get_loop(tally, base, agent_id, stop) for _ in range(4)))
        try:
            kas1.signal(signal.SIGTERM)
            began = time.monotonic()
            await asyncio.to_thread(kas1.wait_exit, 60.0)
            exited_s = time.monotonic() - began
        finally:
            stop.set()
            await load
        assert await system.tunnel_urls(agent_id) == [kas2.private_url]
    finally:
        balancer.stop()
    assert tally.gets > 0 and tally.failed == 0, tally.failures
    assert exited_s < move_timeout_s / 2, "kas 1 waited for its timeout: the agent's move was not noticed"
    log = kas1.process.log_path.read_text() if kas1.process else ""
    # Usually "0 of them already on another kas" (kas 2's announcement moved it); a request's replacement tunnel
    # may reach kas 2 before kas 1 drains, which is as good.
    assert "draining: 1 agents with idle tunnels here" in log
