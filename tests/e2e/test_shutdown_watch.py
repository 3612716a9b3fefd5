"""SIGTERM of a kas ends the watches in flight through it with a clean terminating chunk (issue 9 item 7).

A watch never ends by itself: cut at the end of the grace period, the client sees a broken response. Ended
cleanly, ``kubectl get -w`` and informers simply watch again. Both kas roles are stopped: the routing kas
the client talks to, and the gateway kas holding agentk's tunnel. The gateway kas ends the tunnel itself at the
end of its grace period, with OK: agentk reconnects at once instead of backing off after a failed tunnel.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_k8s_proxy_upgrade import client_tls
from tests.fixtures.bulk_endpoint import Bulk, agent_behind
from tests.fixtures.hub import RealHub
from tests.fixtures.system import AgentkProc, System

pytestmark = [pytest.mark.redis]


@pytest.mark.parametrize("stopped", ["routing_kas", "gateway_kas"])
async def test_sigterm_ends_watches_with_a_terminating_chunk(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path, stopped: str
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id, pat = await agent_behind(system, kas_hub, bulk, kas2, tmp_path)
    victim = kas1 if stopped == "routing_kas" else kas2
    # The routing kas cuts proxied requests after the proxy's grace period, the gateway kas after routing's.
    grace_s = 2.0 if stopped == "routing_kas" else 10.0
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas1))) as session,
        session.get(
            kas1.k8s_proxy_url + "api/v1/pods?watch=true",
            headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"},
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response,
    ):
        assert response.status == 200
        assert b"MODIFIED" in await response.content.readline()
        victim.signal(signal.SIGTERM)
        signalled, signalled_at = time.monotonic(), time.time()
        events = 0
        # A cut connection raises ClientPayloadError here; a clean end returns b"".
        while line := await response.content.readline():
            events += b"MODIFIED" in line
        ended_s = time.monotonic() - signalled
    print(f"{stopped}: watch ended cleanly {ended_s:.1f} s after SIGTERM ({events} more events)")
    assert ended_s <= grace_s + 1.0
    victim.wait_exit()
    agentk = next(p for p in system.started if isinstance(p, AgentkProc))
    # Before the drain ended them, the agent listener's own grace could run out first: gRPC cancelled the tunnel
    # with UNAVAILABLE "Cancelling all calls" and agentk backed off (test_rolling_restart's flake under load).
    assert agentk.tunnel_failures(signalled_at, time.time()) == []


async def test_a_tunnel_broken_mid_watch_ends_it_with_a_terminating_chunk(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    """The gateway kas reports a tunnel that broke mid-watch as an error status; the watch still ends cleanly.

    This is what cut ``test_sigterm_ends_watches_with_a_terminating_chunk[gateway_kas]`` once: at the end of
    the gateway kas' grace period its agent listener may cancel the tunnel before its private listener
    cancels the forwarded call; the gateway then answers an error status after the response head, which the
    routing kas turned into a cut connection. Killing agentk breaks the tunnel in the same way, every time.
    """
    kas1, kas2 = system.kas(), system.kas()
    agent_id, pat = await agent_behind(system, kas_hub, bulk, kas2, tmp_path)
    agentk = next(p for p in reversed(system.started) if isinstance(p, AgentkProc))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas1))) as session,
        session.get(
            kas1.k8s_proxy_url + "api/v1/pods?watch=true",
            headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"},
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response,
    ):
        assert response.status == 200
        assert b"MODIFIED" in await response.content.readline()
        os.kill(agentk.process.pid, signal.SIGKILL)
        # A cut connection raises ClientPayloadError here; a clean end returns b"".
        while await response.content.readline():
            pass
