"""The client's ``?timeout`` bounds a proxied call through the tunnel too (issue 9 item 7).

A watch is long-running for the API server, which ignores ``timeout`` for it (only ``timeoutSeconds`` ends a
watch): before the fix a watch sent with ``?timeout=3s`` ran on for the API server's 30-60 minutes once a
tunnel had taken it. Real hub, kas, agentk and cluster.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_k8s_proxy_session import register_agent, wait_for_tunnel
from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]


async def test_a_watch_ends_cleanly_when_its_timeout_expires(
    hub_launcher: HubLauncher,
    k8s_cluster: ClusterInfo,
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    tmp_path: Path,
) -> None:
    hub = hub_launcher.launch()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server, proxy_tls)  # type: ignore[arg-type]
    try:
        kas1, kas2 = system.kas(), system.kas()
        agent_id, agent_token, alice_token = register_agent(hub)
        system.agentk(agent_token, kas2)
        await wait_for_tunnel(system, kas2, agent_id)
        assert kas1.k8s_proxy_ca is not None
        tls = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
        headers = {"Authorization": f"Bearer pat:{agent_id}:{alice_token}"}
        for kas in (kas2, kas1):  # the agent's own kas, and routed through another one
            started = time.monotonic()
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as http,
                http.get(
                    kas.k8s_proxy_url + "api/v1/namespaces/default/configmaps",
                    params={"watch": "1", "timeout": "3s"},
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=120),
                ) as response,
            ):
                assert response.status == 200, await response.text()
                body = await asyncio.wait_for(response.read(), 60)  # a clean end: no ClientPayloadError
            elapsed = time.monotonic() - started
            assert b'"ADDED"' in body, body[:300]
            assert elapsed < 60, f"the watch outlived its 3 s timeout by far: {elapsed:.1f}s"
        assert kas1.readiness()[0] == 200 and kas2.readiness()[0] == 200
    finally:
        system.stop_all()
