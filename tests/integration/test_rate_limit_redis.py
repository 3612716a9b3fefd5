"""The shared rate limiter under a burst (issue 9, found at 1,000 connecting agents).

redis-py's default asyncio pool fails at once beyond 100 connections; the limiter failed open on each such
check (700 warnings and no limit while 1,000 agents connected). Its pool now waits for a free connection.
"""

from __future__ import annotations

import asyncio

import pytest

from tether.tool.rate_limit import RateLimiter, per_minute

pytestmark = [pytest.mark.redis]


def storage_errors() -> float:
    from prometheus_client import REGISTRY  # noqa: PLC0415

    return REGISTRY.get_sample_value("tether_rate_limit_storage_errors_total") or 0.0


async def test_a_burst_of_checks_is_counted_not_failed_open(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, "burst:rate_limit")
    errors_before = storage_errors()
    limit = per_minute(250)
    results = await asyncio.gather(*(limiter.hit("agent_rpc", limit, "token-digest") for _ in range(600)))
    assert storage_errors() == errors_before
    assert results.count(True) == 250 and results.count(False) == 350


async def test_a_small_pool_makes_checks_wait_instead_of_failing(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, "small:rate_limit", pool_size=2, pool_timeout_s=10.0)
    errors_before = storage_errors()
    results = await asyncio.gather(*(limiter.hit("x", per_minute(1000), "k") for _ in range(200)))
    assert storage_errors() == errors_before
    assert all(results)
