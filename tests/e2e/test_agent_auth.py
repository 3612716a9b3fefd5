"""Agent token authentication through the hub's internal API: caching, cached refusals, revocation."""

from __future__ import annotations

import asyncio
import hashlib
import time

import grpc
import pytest
import redis.asyncio as aioredis

from tests.fixtures.hub import RealHub
from tests.fixtures.system import System
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as config_pb2
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as config_grpc

pytestmark = pytest.mark.redis


async def first_configuration(target: str, token: str) -> config_pb2.ConfigurationResponse:
    async with grpc.aio.insecure_channel(target) as channel:
        stream = config_grpc.AgentConfigurationStub(channel).GetConfiguration(
            config_pb2.ConfigurationRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=10
        )
        async for response in stream:
            stream.cancel()
            return response
    raise AssertionError("no configuration")


def info_calls(hub: RealHub) -> int:
    return hub.internal_calls("agent_info")


async def test_successes_are_cached_and_refusals_cached_in_redis(system: System, kas_hub: RealHub) -> None:
    token = f"cached-{time.monotonic_ns()}"
    kas_hub.add_agent(token, 77, 8, config={"observability": {"logging": {"level": "debug"}}})
    kas = system.kas(agent={"info_cache_ttl": "60s", "info_cache_error_ttl": "60s"})
    target = kas.agent_address.removeprefix("grpc://")
    before = info_calls(kas_hub)
    response = await first_configuration(target, token)
    assert response.configuration.agent_id == 77 and response.configuration.project_id == 8
    assert response.configuration.observability.logging.level == 1  # debug
    await first_configuration(target, token)
    assert info_calls(kas_hub) == before + 1, "the second lookup must come from the cache"

    unknown = f"unknown-{time.monotonic_ns()}"
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await first_configuration(target, unknown)
        assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info_calls(kas_hub) == before + 2, "a refusal is asked once, then served from Redis"
    assert system.redis is not None
    client = aioredis.Redis.from_url(system.redis.url)
    try:
        key = (
            f"{system.key_prefix}:agent_info_errs:".encode()
            + hashlib.sha256(unknown.encode()).digest()  # the whole token: a shared first half shares nothing
        )
        assert b"401" in (await client.get(key) or b"")
        assert 0 < await client.pttl(key) <= 60_000
        assert unknown.encode() not in b"".join(await client.keys("*")), "tokens never reach Redis in plain text"
    finally:
        await client.aclose()


async def test_revoked_token_is_refused_on_next_authentication(system: System, kas_hub: RealHub) -> None:
    token = f"revoked-{time.monotonic_ns()}"
    kas_hub.add_agent(token, 78, 8)
    kas = system.kas()  # info_cache_ttl 1s in tests
    target = kas.agent_address.removeprefix("grpc://")
    await first_configuration(target, token)
    kas_hub.revoke(token)
    await asyncio.sleep(1.5)
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await first_configuration(target, token)
    assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_connections_per_token_per_minute_holds_across_kas_replicas(system: System, kas_hub: RealHub) -> None:
    """Issue 9 item 4: the limit was accepted but not enforced; it now counts every kas' RPCs in Redis."""
    token, other = f"limited-{time.monotonic_ns()}", f"unlimited-{time.monotonic_ns()}"
    kas_hub.add_agent(token, 79, 8)
    kas_hub.add_agent(other, 80, 8)
    limit = {"agent": {"listen": {"connections_per_token_per_minute": 5}}}
    kas1, kas2 = system.kas(**limit), system.kas(**limit)
    targets = [k.agent_address.removeprefix("grpc://") for k in (kas1, kas2, kas1, kas2, kas1)]
    for target in targets:
        await first_configuration(target, token)
    before = info_calls(kas_hub)
    for target in targets[:2]:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await first_configuration(target, token)
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "connections_per_token_per_minute" in (failure.value.details() or "")
    assert info_calls(kas_hub) == before, "a throttled RPC costs no hub call"
    await first_configuration(targets[0], other)  # another token has its own budget
    assert 'tether_rate_limited_total{limit="agent_rpc"}' in kas1.metrics()
    # Upstream's counter of the same refusals (issue 25 item 4): one on each kas.
    assert kas1.gauge("agent_server_rate_exceeded_total") == 1
    assert kas2.gauge("agent_server_rate_exceeded_total") == 1
