"""The private redis-server is a real one: transactions, WATCH, key expiry and pub/sub behave as in production."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ExecAbortError, ResponseError, WatchError

from tests.support.polling import poll

pytestmark = pytest.mark.redis


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.from_url(redis_url)
    try:
        yield conn
    finally:
        await conn.aclose()


@pytest.fixture
async def other(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A second, independent client: the "someone else" in concurrency tests."""
    conn = aioredis.from_url(redis_url)
    try:
        yield conn
    finally:
        await conn.aclose()


async def test_starts_from_clean_state(client: aioredis.Redis) -> None:
    assert await client.dbsize() == 0
    await client.set("leftover", "x")  # the next test must not see it


async def test_starts_from_clean_state_again(client: aioredis.Redis) -> None:
    assert await client.dbsize() == 0


async def test_multi_exec_pipeline_applies_all_commands(client: aioredis.Redis) -> None:
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset("agent:1", mapping={"name": "alpha", "version": "1"})
        pipe.pexpire("agent:1", 60_000)
        pipe.hset("agent:2", mapping={"name": "beta"})
        pipe.pexpire("agent:2", 60_000)
        results = await pipe.execute()

    assert results == [2, True, 1, True]
    assert await client.hgetall("agent:1") == {b"name": b"alpha", b"version": b"1"}
    assert await client.hgetall("agent:2") == {b"name": b"beta"}
    for key in ("agent:1", "agent:2"):
        assert 0 < await client.pttl(key) <= 60_000


async def test_multi_queues_on_the_server_until_exec(client: aioredis.Redis, other: aioredis.Redis) -> None:
    # Speak MULTI/EXEC on one raw connection so the queueing happens in the server, not in a client-side buffer.
    conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.send_command("MULTI")
        assert await conn.read_response() == b"OK"
        await conn.send_command("HSET", "agent:1", "name", "alpha")
        assert await conn.read_response() == b"QUEUED"
        await conn.send_command("PEXPIRE", "agent:1", "60000")
        assert await conn.read_response() == b"QUEUED"

        assert await other.exists("agent:1") == 0, "queued commands must not be visible before EXEC"

        await conn.send_command("EXEC")
        assert await conn.read_response() == [1, 1]
    finally:
        await client.connection_pool.release(conn)

    assert await other.hget("agent:1", "name") == b"alpha"
    assert 0 < await other.pttl("agent:1") <= 60_000


async def test_multi_exec_is_all_or_nothing_on_queueing_error(client: aioredis.Redis) -> None:
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset("agent:1", mapping={"name": "alpha"})
        pipe.execute_command("PEXPIRE", "agent:1")  # wrong arity: rejected while queueing
        with pytest.raises((ExecAbortError, ResponseError)):
            await pipe.execute()

    assert await client.exists("agent:1") == 0, "EXECABORT must discard the whole transaction"


async def test_watch_commits_when_watched_key_is_untouched(client: aioredis.Redis) -> None:
    await client.set("counter", 10)
    async with client.pipeline(transaction=True) as pipe:
        await pipe.watch("counter")
        current = int(await pipe.get("counter") or 0)
        pipe.multi()  # type: ignore[no-untyped-call]
        pipe.set("counter", current + 1)
        assert await pipe.execute() == [True]
    assert await client.get("counter") == b"11"


async def test_watch_aborts_when_another_client_modifies_the_key(client: aioredis.Redis, other: aioredis.Redis) -> None:
    await client.set("counter", 10)
    async with client.pipeline(transaction=True) as pipe:
        await pipe.watch("counter")
        current = int(await pipe.get("counter") or 0)

        await other.set("counter", 100)  # the concurrent writer wins the race

        pipe.multi()  # type: ignore[no-untyped-call]
        pipe.set("counter", current + 1)
        with pytest.raises(WatchError):
            await pipe.execute()

    assert await client.get("counter") == b"100", "the aborted transaction must not overwrite the other write"


async def test_key_expires_after_pexpire(client: aioredis.Redis) -> None:
    await client.set("short", "v")
    assert await client.pexpire("short", 200) is True
    # Right after PEXPIRE the key has a TTL of at most 200 ms, or (on a very slow machine) is already gone.
    pttl = await client.pttl("short")
    assert pttl == -2 or 0 <= pttl <= 200

    async def gone() -> bool:
        return await client.exists("short") == 0

    await poll(gone, "expiry of a key with PEXPIRE 200")
    assert await client.get("short") is None
    assert await client.ttl("short") == -2
    assert await client.pttl("short") == -2


async def test_ttl_values_are_sane(client: aioredis.Redis) -> None:
    await client.set("long", "v", px=90_000)
    assert 0 < await client.pttl("long") <= 90_000
    assert 0 < await client.ttl("long") <= 90

    await client.set("forever", "v")
    assert await client.ttl("forever") == -1
    assert await client.pttl("forever") == -1

    assert await client.persist("long") is True
    assert await client.pttl("long") == -1
    assert await client.pttl("missing") == -2


async def next_message(pubsub: aioredis.client.PubSub) -> dict[str, Any]:
    async def receive() -> dict[str, Any] | None:
        message: dict[str, Any] | None = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        return message

    message: dict[str, Any] = await poll(receive, "delivery of a pub/sub message")
    return message


async def test_pubsub_delivers_published_message(client: aioredis.Redis, other: aioredis.Redis) -> None:
    async with client.pubsub() as pubsub:
        await pubsub.subscribe("agent-events")

        # PUBLISH returns the number of receivers: polling it also waits for the subscription to be registered.
        async def delivered() -> bool:
            return await other.publish("agent-events", "connected") == 1

        await poll(delivered, "registration of the subscription")
        message = await next_message(pubsub)

    assert message["type"] == "message"
    assert message["channel"] == b"agent-events"
    assert message["data"] == b"connected"


async def test_pattern_subscribe_matches_channels(client: aioredis.Redis, other: aioredis.Redis) -> None:
    async with client.pubsub() as pubsub:
        await pubsub.psubscribe("tunnel.*")

        async def delivered() -> bool:
            return await other.publish("tunnel.agent-7", "up") == 1

        await poll(delivered, "registration of the pattern subscription")
        message = await next_message(pubsub)

        assert await other.publish("unrelated.agent-7", "up") == 0, "a non-matching channel has no receivers"

    assert message["type"] == "pmessage"
    assert message["pattern"] == b"tunnel.*"
    assert message["channel"] == b"tunnel.agent-7"
    assert message["data"] == b"up"
