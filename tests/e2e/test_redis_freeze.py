"""A frozen Redis does not hold up requests to agents on the kas that receives them (issue 27 item 5).

Redis stopped with SIGSTOP accepts connections and answers nothing. Before, kas read the source address's
refused-credentials counter (proxy) and the token's RPC counter (each tunnel agentk re-opens) from Redis before
authenticating, waiting for the 3 s socket timeout each time: requests overran their own ``?timeout`` and the
kas served a few percent of its usual rate. Now rate limits count in memory within milliseconds of the stall.

With more clients than agentk keeps idle tunnels, requests also wait in routing, which reads the tunnel tracker
from Redis. A routed request used to wait, past its deadline, for such a read to end after it had cancelled
it: redis-py went on with a cancelled command on a new connection until its 3 s socket timeout (CI: 1 of
2,496 requests with 4 clients; 6-14 per run with 24).

A kas stopped (SIGTERM) while Redis is frozen stops within its grace period. It used to take 38 s with a 10 s
grace: its drain waited for each Redis read and delete (the instance list, this kas' entries) to end after it
had given up on it, each with its socket timeouts and retries. A pod's ``terminationGracePeriodSeconds`` would
kill it instead.

An agent that connects to a kas whose Redis is already frozen is reachable through that kas as soon as its
tunnels are up, and no request overruns its deadline meanwhile. Before, the first call through each of kas'
Redis circuit breakers waited up to 5 s for Redis' first answer (the bound for a store that has not answered
yet): the first proxied requests got no answer within 3 s and the agent was reachable after 9.4 s.

Real Redis (private, frozen here), real hub, kas and agentk; the endpoint behind agentk answers a bare 404.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.e2e.test_k8s_proxy_upgrade import agent_kubeconfig, client_tls
from tests.fixtures.bulk_endpoint import Bulk, agent_behind
from tests.fixtures.hub import RealHub
from tests.fixtures.system import KasProc, System
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.redis]

#: Enough that requests often find no idle tunnel and wait in routing (agentk keeps a few idle tunnels).
CLIENTS = 24
#: The request's own timeout (kas bounds the call by it) and the client's, one second more.
REQUEST_TIMEOUT_S = 2.0
CLIENT_DEADLINE_S = REQUEST_TIMEOUT_S + 1.0
BEFORE_S, FROZEN_S = 5.0, 12.0


class FrozenRedis:
    """A private Redis for one kas, frozen (SIGSTOP) on demand; thawed and stopped when the block ends."""

    def __init__(self, directory: Path) -> None:
        self.server = RedisServer(directory)
        self.frozen = False

    def __enter__(self) -> FrozenRedis:
        self.server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.frozen:
            os.kill(self.server.pid, signal.SIGCONT)
        self.server.stop()

    @property
    def kas_settings(self) -> dict[str, Any]:
        return {"server": {"address": f"127.0.0.1:{self.server.port}"}}

    def freeze(self) -> None:
        os.kill(self.server.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        os.kill(self.server.pid, signal.SIGCONT)
        self.frozen = False


@dataclass
class Served:
    #: (started, ended, None when the request reached the agent, else what went wrong)
    outcomes: list[tuple[float, float, str | None]] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[tuple[float, float, str | None]]:
        return [o for o in self.outcomes if start <= o[0] and o[1] <= end]


def start_agent(system: System, kas_hub: RealHub, bulk: Bulk, kas: KasProc, tmp_path: Path, agent_id: int) -> str:
    """Start agentk for a new agent ``agent_id`` on ``kas``, with ``bulk`` as its cluster; return a PAT that may
    use the proxy for it. Does not wait for it: the tunnel tracker may be frozen."""
    pat, token = f"glpat-freeze-{agent_id}", f"freeze-agent-{agent_id}-{time.monotonic_ns()}"
    kas_hub.add_agent(token, agent_id, 76, f"freeze-{agent_id}")
    kas_hub.grant_proxy_access(pat, "robot", agent_id, 76)
    kubeconfig = agent_kubeconfig(tmp_path / "agent.kubeconfig", f"http://127.0.0.1:{bulk.port}", "sa")
    system.agentk(token, kas, f"freeze-{agent_id}", kubeconfig=kubeconfig)
    return pat


async def one_request(session: aiohttp.ClientSession, kas: KasProc, agent_id: int, pat: str) -> str | None:
    """One proxied request; None when the endpoint behind agentk answered (its bare 404) within the deadline, else
    what the client got instead."""
    try:
        async with session.get(
            kas.k8s_proxy_url + f"version?timeout={REQUEST_TIMEOUT_S:g}s",
            headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"},
            timeout=aiohttp.ClientTimeout(total=CLIENT_DEADLINE_S),
        ) as response:
            body = await response.read()
            return None if response.status == 404 and body == b"" else f"{response.status} {body[:120]!r}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return repr(exc)


async def load(served: Served, kas: KasProc, agent_id: int, pat: str, stop_at: float) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas))) as session:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            outcome = await one_request(session, kas, agent_id, pat)
            served.outcomes.append((started, time.monotonic(), outcome))


async def test_requests_to_local_agents_meet_their_deadline_while_redis_is_frozen(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    with FrozenRedis(tmp_path / "frozen-redis") as redis:
        # Short info cache (the fixture's 1 s): agentk's tunnels keep asking the hub, reading the refusal cache.
        kas = system.kas(redis=redis.kas_settings)
        agent_id = 9201
        pat = start_agent(system, kas_hub, bulk, kas, tmp_path, agent_id)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas))) as session:
            deadline = time.monotonic() + 60
            while await one_request(session, kas, agent_id, pat) is not None:
                assert time.monotonic() < deadline, "the agent never became reachable"
                await asyncio.sleep(0.5)

        served = Served()
        began = time.monotonic()
        stop_at = began + BEFORE_S + FROZEN_S
        clients = asyncio.gather(*(load(served, kas, agent_id, pat, stop_at) for _ in range(CLIENTS)))
        await asyncio.sleep(BEFORE_S)
        freeze_at = time.monotonic()
        redis.freeze()
        await clients
        thaw_at = time.monotonic()
        redis.thaw()

    before = served.between(began, freeze_at)
    during = served.between(freeze_at, thaw_at)
    failed = [f"{end - start:.2f} s: {why}" for start, end, why in during if why is not None]
    print(f"requests before the freeze: {len(before)} in {BEFORE_S:g} s; during: {len(during)} in {FROZEN_S:g} s")
    assert before and all(why is None for _, _, why in before), "requests failed before Redis was frozen"
    assert during, "no request ended while Redis was frozen"
    assert not failed, f"{len(failed)} of {len(during)} requests failed or overran their deadline: {failed[:10]}"


async def test_kas_stops_within_its_grace_period_while_redis_is_frozen(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    with FrozenRedis(tmp_path / "frozen-redis") as redis:
        kas = system.kas(redis=redis.kas_settings)
        grace_s = float(kas.config["routing"]["shutdown_grace_period"].removesuffix("s"))
        port = redis.server.port
        await agent_behind(system, kas_hub, bulk, kas, tmp_path, lambda: aioredis.Redis(port=port))
        redis.freeze()
        await asyncio.sleep(1.0)  # kas' own Redis calls are now waiting on it too
        kas.signal(signal.SIGTERM)
        signalled = time.monotonic()
        kas.wait_exit(timeout=120)
        stopped_s = time.monotonic() - signalled
    print(f"kas stopped {stopped_s:.1f} s after SIGTERM (grace {grace_s:g} s)")
    assert stopped_s <= grace_s + 3.0, f"kas took {stopped_s:.1f} s to stop, its grace period is {grace_s:g} s"


async def test_an_agent_connecting_while_redis_is_frozen_is_reachable_at_once(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    outcomes: list[str] = []
    with FrozenRedis(tmp_path / "frozen-redis") as redis:
        kas = system.kas(redis=redis.kas_settings)
        redis.freeze()
        agent_id = 9202
        started = time.monotonic()
        pat = start_agent(system, kas_hub, bulk, kas, tmp_path, agent_id)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas))) as session:
            while (why := await one_request(session, kas, agent_id, pat)) is not None:
                outcomes.append(f"{time.monotonic() - started:.1f} s: {why[:80]}")
                assert time.monotonic() - started < 60, f"the agent never became reachable: {outcomes[-5:]}"
                await asyncio.sleep(0.2)
        reachable_s = time.monotonic() - started
    print(f"reachable {reachable_s:.1f} s after agentk started; before: {outcomes}")
    # Until its tunnels are up kas answers 504 within the request's 2 s, never nothing within the client's 3 s.
    assert not [o for o in outcomes if "TimeoutError" in o], outcomes
