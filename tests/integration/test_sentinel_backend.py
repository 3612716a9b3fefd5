"""kas' Redis clients on a Sentinel-managed Redis: what must survive a failover does (issue 26 item 1).

A master, one replica and three sentinels (tests/fixtures/sentinel.py). Redis replicates asynchronously, so a
write the master acknowledged can be missing on the replica Sentinel promotes. The token revocation list is
the one write kas acknowledges to someone else (the hub stops retrying once kas answers), so it waits for the
replicas; the rate limiter and the pub/sub subscription only need to find the new master.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
from redis.exceptions import RedisError

from tests.fixtures.sentinel import MASTER_NAME, SentinelRedis
from tether.kas.token_revocation import RevocationList
from tether.tool.expiring_hash import NotReplicated
from tether.tool.rate_limit import RateLimiter, per_minute
from tether.tool.redis_backend import RedisBackend
from tether.tool.redis_pool import RedisTarget, SentinelMaster

pytestmark = [pytest.mark.redis]


def target_of(sentinel: SentinelRedis) -> RedisTarget:
    sentinels = tuple(("127.0.0.1", s.port or 0) for s in sentinel.sentinels)
    return RedisTarget(
        sentinel=SentinelMaster(MASTER_NAME, sentinels, sentinel.sentinel_password), password=sentinel.password
    )


async def test_revocations_wait_for_the_replica_and_survive_a_failover(tmp_path: Path) -> None:
    sentinel = await asyncio.to_thread(SentinelRedis(tmp_path).start)
    backend = RedisBackend.connect(target_of(sentinel), dial_timeout_s=1.0)
    limiter = RateLimiter(target_of(sentinel), "t:rate_limit", timeout_s=1.0)
    revocations = RevocationList(backend, "t", 3600.0)
    subscribed: list[float] = []
    first_subscription = asyncio.Event()
    messages: list[bytes] = []

    def on_subscribed() -> None:
        subscribed.append(time.monotonic())
        first_subscription.set()

    async def listen() -> None:
        async for payload in backend.subscribe("t:events", on_subscribed):
            messages.append(payload)

    listener = asyncio.create_task(listen())
    try:
        lost, kept = hashlib.sha256(b"lost").digest(), hashlib.sha256(b"kept").digest()
        master = sentinel.master
        replica = next(server for server in sentinel.servers if server is not master)
        # A replica that does not acknowledge: the revocation is refused (the hub retries), not acknowledged.
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated):
                await revocations.add([lost])
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        await asyncio.to_thread(sentinel.wait_settled, master.port or 0, 60.0)
        await revocations.add([kept])
        assert await limiter.hit("connect", per_minute(100), "k")
        await asyncio.wait_for(first_subscription.wait(), 30)

        killed_at = time.monotonic()
        await asyncio.to_thread(sentinel.kill_master)
        deadline = killed_at + 60
        while True:
            try:
                listed = await revocations.read()
                break
            except RedisError:
                assert time.monotonic() < deadline, "the new master was never reached"
                await asyncio.sleep(0.1)
        assert kept in listed, "an acknowledged revocation was lost in the failover"
        # The subscription was re-made on the new master: events flow again.
        while len(subscribed) < 2 or not messages:
            assert time.monotonic() < deadline, f"no re-subscription after the failover: {subscribed}"
            await backend.publish("t:events", b"after")
            await asyncio.sleep(0.1)
        assert messages[-1] == b"after"
        # The rate limiter's circuit breaker closed again: its counts go to the new master, not to memory.
        await backend.client.delete(*await backend.client.keys("t:rate_limit*"))
        while not await backend.client.keys("t:rate_limit*"):
            assert time.monotonic() < deadline, "the rate limiter never went back to Redis"
            await limiter.hit("connect", per_minute(100), "k")
            await asyncio.sleep(0.2)
    finally:
        listener.cancel()
        await backend.close()
        await limiter.close()
        await asyncio.to_thread(sentinel.stop)
