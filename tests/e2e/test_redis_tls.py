"""kas and Redis over TLS (upstream's ``redis.tls``, kas.md §3.1).

A Redis that speaks TLS only and verifies its clients' certificates, shared by two kas: agentk connects to kas 2,
kas 2 records its tunnels in the tunnel tracker over TLS, and a request reaching kas 1 for that agent is routed
to kas 2 through the tracker, read over TLS. A kas that does not trust the server's certificate does not talk to
it: it stays not ready, and says why.

Real Redis (``--tls-port``), hub, kas and agentk; certificates from a throw-away CA.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.e2e.test_k8s_proxy_upgrade import client_tls
from tests.e2e.test_redis_freeze import one_request
from tests.fixtures.bulk_endpoint import Bulk, agent_behind
from tests.fixtures.hub import RealHub
from tests.fixtures.system import System
from tether_devenv import pki
from tether_devenv.redis_server import RedisServer, RedisServerTls

pytestmark = [pytest.mark.redis]


def _tls_redis(directory: Path) -> tuple[RedisServer, dict[str, Any]]:
    """A TLS-only Redis and the ``redis`` section of kas' configuration for it."""
    ca = pki.generate(directory / "pki")
    server_cert, server_key = pki.issue(
        ca.ca_cert, ca.ca_key, directory / "pki", "redis", "redis", ips=("127.0.0.1",), server=True
    )
    kas_cert, kas_key = pki.issue(ca.ca_cert, ca.ca_key, directory / "pki", "kas", "kas")
    redis = RedisServer(directory / "redis", tls=RedisServerTls(server_cert, server_key, ca.ca_cert)).start()
    section = {
        "server": {"address": f"127.0.0.1:{redis.port}"},
        "tls": {
            "enabled": True,
            "ca_certificate_file": str(ca.ca_cert),
            "certificate_file": str(kas_cert),
            "key_file": str(kas_key),
        },
    }
    return redis, section


def _tls_client(section: dict[str, Any], url: str) -> aioredis.Redis:
    """The test's own client, with kas' certificate."""
    tls = section["tls"]
    return aioredis.Redis.from_url(
        url, ssl_ca_certs=tls["ca_certificate_file"], ssl_certfile=tls["certificate_file"], ssl_keyfile=tls["key_file"]
    )


async def test_two_kas_route_through_a_redis_that_speaks_tls_only(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    redis, section = _tls_redis(tmp_path / "tls")
    try:
        kas1, kas2 = system.kas(redis=section), system.kas(redis=section)  # ready: each answered PING over TLS
        # Returns once kas 2 has recorded the agent's tunnels in the TLS Redis.
        agent_id, pat = await agent_behind(
            system, kas_hub, bulk, kas2, tmp_path, lambda: _tls_client(section, redis.url)
        )
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas1))) as session:
            # kas 1 holds no tunnel of the agent: it finds kas 2 in the tracker, over TLS.
            assert await one_request(session, kas1, agent_id, pat) is None
    finally:
        system.stop_all()
        redis.stop()


async def test_a_kas_that_does_not_trust_the_server_stays_not_ready_and_says_why(
    system: System, tmp_path: Path
) -> None:
    redis, section = _tls_redis(tmp_path / "tls")
    stranger = pki.generate(tmp_path / "other-ca")
    section["tls"]["ca_certificate_file"] = str(stranger.ca_cert)
    try:
        kas = system.kas(redis=section, wait_ready=False)
        deadline = time.monotonic() + 30
        while "certificate verify failed" not in (answer := await asyncio.to_thread(kas.readiness))[1]:
            assert time.monotonic() < deadline, f"readiness never reported the refused server: {answer}"
            await asyncio.sleep(0.5)
        assert answer[0] == 503
    finally:
        system.stop_all()
        redis.stop()
