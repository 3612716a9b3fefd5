"""Redis :class:`~tether.tool.expiring_hash.HashBackend` on ``redis.asyncio`` (kas.md §3.1, §3.5)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisError, WatchError

from tether.tool.backoff import Backoff
from tether.tool.expiring_hash import GC_ATTEMPTS, GcHook, NotReplicated, Publication, expired_fields
from tether.tool.redis_pool import RedisTarget, blocking_pool, close_client

_log = logging.getLogger(__name__)

CLIENT_NAME = "gitlab-kas"  # kas.md §3.1 constructRedisClient
DIAL_TIMEOUT_S = 5.0  # kas.md §3.1 default dial timeout
WRITE_TIMEOUT_S = 3.0  # kas.md §3.1 default write timeout
# A pooled connection idle this long is PINGed before use, so a dead subscription is noticed.
HEALTH_CHECK_INTERVAL_S = 30
# Retries of a command after a connection error or timeout (each on a fresh connection).
COMMAND_RETRIES = 2
#: Connections kas keeps to Redis at most. redis-py's asyncio default (100, then ``MaxConnectionsError`` at
#: once) failed tracker writes while thousands of agents connected (issue 9 item 3).
POOL_SIZE = 256
#: Seconds a command waits for a pooled connection before failing.
POOL_TIMEOUT_S = 5.0
# How often a blocked subscription read wakes up to notice close().
_SUBSCRIBE_POLL_S = 1.0


def _field_bytes(field: str) -> bytes:
    # surrogateescape round-trips any field bytes another writer might have stored.
    return field.encode("utf-8", "surrogateescape")


def _field_str(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


async def _hscan_all(client: aioredis.Redis | Pipeline, key: bytes) -> dict[str, bytes]:
    fields: dict[str, bytes] = {}
    cursor = 0
    while True:
        cursor, page = await client.hscan(key, cursor)
        # decode_responses=False and no NOVALUES: the page is a dict of bytes.
        for name, value in cast("dict[bytes, bytes]", page).items():
            fields[_field_str(name)] = value
        if cursor == 0:
            return fields


#: Most ``PUBLISH`` commands sent in one pipeline by :meth:`RedisBackend.publish`.
PUBLISH_BATCH = 500


class RedisBackend:
    """Expiring-hash storage and pub/sub in Redis.

    Args:
        client: a ``redis.asyncio.Redis`` with ``decode_responses=False``; closed by :meth:`close`.
        gc_before_exec: test hook awaited in :meth:`gc` after the WATCHed scan and before ``MULTI/EXEC``.

    Errors are ``redis.exceptions.RedisError`` (e.g. ``ConnectionError``, ``TimeoutError``) or ``OSError``.
    """

    def __init__(self, client: aioredis.Redis, *, gc_before_exec: GcHook | None = None) -> None:
        self._client = client
        self._gc_before_exec = gc_before_exec
        self._closed = False
        self._to_publish: deque[tuple[str, bytes, asyncio.Future[None]]] = deque()
        self._publisher: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """Connect lazily to one server at ``url`` (``redis://host:port/db``, ``rediss://...``, ``unix:///path?db=N``).

        ``options`` are those of :meth:`connect`.
        """
        return cls.connect(RedisTarget(url=url), **options)

    @classmethod
    def connect(
        cls,
        target: RedisTarget,
        *,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        client_name: str = CLIENT_NAME,
        gc_before_exec: GcHook | None = None,
        pool_size: int = POOL_SIZE,
        pool_timeout_s: float = POOL_TIMEOUT_S,
    ) -> RedisBackend:
        """Connect lazily to ``target``: one server, or the master its sentinels name (redis-py's Sentinel support).

        Args:
            target: where Redis is (:class:`~tether.tool.redis_pool.RedisTarget`).
            dial_timeout_s: TCP connect timeout in seconds (kas.md §3.1: 5 s).
            write_timeout_s: socket timeout in seconds; redis-py has one timeout for writes and reads of
                command replies (kas.md §3.1 names it the write timeout: 3 s). Subscriptions block without it.
            client_name: sent with ``CLIENT SETNAME`` on every connection (kas.md §3.1: ``gitlab-kas``).
            gc_before_exec: see :class:`RedisBackend`.
            pool_size: most connections open at once (subscriptions included).
            pool_timeout_s: seconds a command waits for a free connection when all are busy, then fails with
                ``redis.exceptions.ConnectionError``.

        A command failing with a connection error or timeout is retried :data:`COMMAND_RETRIES` times on a new
        connection (10 ms to 0.5 s jittered backoff); with Sentinel, each new connection asks the sentinels for
        the current master, so a retry after a failover reaches the new one.
        """
        pool = blocking_pool(
            target,
            max_connections=pool_size,
            timeout_s=pool_timeout_s,
            client_name=client_name,
            decode_responses=False,
            socket_connect_timeout=dial_timeout_s,
            socket_timeout=write_timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            # Connections are otherwise built without retries: after a Redis restart (or a failover) every pooled
            # connection would fail its next command once. All our writes are idempotent (HSET, PEXPIRE, HDEL);
            # a retried PUBLISH may deliver an event twice, which listeners tolerate.
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), retries=COMMAND_RETRIES),
        )
        return cls(aioredis.Redis.from_pool(pool), gc_before_exec=gc_before_exec)

    @property
    def client(self) -> aioredis.Redis:
        """The underlying client (for probes and tests)."""
        return self._client

    async def set_fields(
        self, writes: Sequence[tuple[bytes, Mapping[str, bytes]]], ttl_s: float, announce: Sequence[Publication] = ()
    ) -> None:
        """One pipelined ``MULTI; (HSET key f v ...; PEXPIRE key ttl_ms)*; (PUBLISH channel payload)*; EXEC``.

        kas.md §3.1 set builder; the ``PUBLISH`` commands run after the writes inside ``EXEC``, so a subscriber
        woken by one reads the write (Redis runs a transaction's commands in order, uninterrupted).
        """
        if not writes and not announce:
            return
        ttl_ms = max(1, round(ttl_s * 1000))
        async with self._client.pipeline(transaction=True) as pipe:
            for key, fields in writes:
                if not fields:
                    continue
                pipe.hset(key, mapping={_field_bytes(name): value for name, value in fields.items()})
                pipe.pexpire(key, ttl_ms)
            for channel, payload in announce:
                pipe.publish(channel, payload)
            await pipe.execute()

    async def set_fields_replicated(
        self, writes: Sequence[tuple[bytes, Mapping[str, bytes]]], ttl_s: float, timeout_s: float
    ) -> None:
        """``ROLE`` for the replicas connected now, then one pipeline ``(HSET; PEXPIRE)*; WAIT n timeout``.

        ``WAIT`` counts the writes of its own connection, so the writes and ``WAIT`` go in one pipeline (one
        connection; a retried pipeline re-sends all of it). Without replicas there is nothing to wait for: no
        replica can be promoted with the write missing.

        Raises:
            NotReplicated: fewer than the replicas connected at the start acknowledged within ``timeout_s``.
        """
        role = await self._client.role()
        replicas = len(role[2]) if role and role[0] in (b"master", "master") else 0
        ttl_ms = max(1, round(ttl_s * 1000))
        async with self._client.pipeline(transaction=False) as pipe:
            for key, fields in writes:
                if not fields:
                    continue
                pipe.hset(key, mapping={_field_bytes(name): value for name, value in fields.items()})
                pipe.pexpire(key, ttl_ms)
            if replicas:
                pipe.wait(replicas, max(1, round(timeout_s * 1000)))
            results = await pipe.execute()
        if replicas and int(results[-1]) < replicas:
            raise NotReplicated(f"{results[-1]} of {replicas} replicas acknowledged within {timeout_s:g} s")

    async def delete_fields(self, key: bytes, fields: Sequence[str]) -> None:
        """``HDEL key field...``."""
        if fields:
            await self._client.hdel(key, *(_field_bytes(name) for name in fields))

    async def delete_many(self, deletes: Sequence[tuple[bytes, Sequence[str]]]) -> None:
        """``MULTI; HDEL key field...; ...; EXEC``."""
        deletes = [(key, fields) for key, fields in deletes if fields]
        if not deletes:
            return
        async with self._client.pipeline(transaction=True) as pipe:
            for key, fields in deletes:
                pipe.hdel(key, *(_field_bytes(name) for name in fields))
            await pipe.execute()

    async def scan(self, key: bytes) -> dict[str, bytes]:
        """``HSCAN`` until cursor 0; field -> raw value."""
        return await _hscan_all(self._client, key)

    async def gc(self, key: bytes, now_s: float) -> int:
        """``WATCH``; ``HSCAN``; ``MULTI; HDEL expired...; EXEC`` on a dedicated pooled connection (kas.md §3.1).

        A conflict (EXEC returns nil: another client changed the key) is retried once; after
        :data:`GC_ATTEMPTS` conflicts the round gives up and returns 0.
        """
        for attempt in range(1, GC_ATTEMPTS + 1):
            # pipeline() pins one connection from WATCH to EXEC; leaving the block UNWATCHes and releases it.
            async with self._client.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                expired = expired_fields(await _hscan_all(pipe, key), now_s)
                if not expired:
                    return 0
                if self._gc_before_exec is not None:
                    await self._gc_before_exec(key)
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.hdel(key, *(_field_bytes(name) for name in expired))
                try:
                    await pipe.execute()
                except WatchError:
                    _log.debug("GC of %r conflicted with a writer (attempt %d/%d)", key, attempt, GC_ATTEMPTS)
                    continue
                return len(expired)
        return 0

    async def hlen(self, key: bytes) -> int:
        """``HLEN key``."""
        return int(await self._client.hlen(key))

    async def publish(self, channel: str, payload: bytes) -> None:
        """``PUBLISH channel payload``; publications made while others are on the wire share the next round trip.

        One pipeline (not a transaction) of at most :data:`PUBLISH_BATCH` commands, in call order: when 10,000
        agents connect, each announcing itself, kas then pays a round trip per batch, not per event (issue 9).
        A caller cancelled after its payload went out does not take it back (events are fire-and-forget).
        """
        done = asyncio.get_running_loop().create_future()
        self._to_publish.append((channel, payload, done))
        if self._publisher is None:
            # A context of its own: its log lines are not the first caller's (agent_id, connection_id).
            self._publisher = asyncio.create_task(self._publish_queued(), context=contextvars.Context())
        await done

    async def _publish_queued(self) -> None:
        try:
            while self._to_publish:
                batch = [self._to_publish.popleft() for _ in range(min(PUBLISH_BATCH, len(self._to_publish)))]
                batch = [item for item in batch if not item[2].done()]  # cancelled while waiting
                if not batch:
                    continue
                try:
                    async with self._client.pipeline(transaction=False) as pipe:
                        for channel, payload, _ in batch:
                            pipe.publish(channel, payload)
                        await pipe.execute()
                except Exception as exc:
                    for _, _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                for _, _, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._publisher = None
            while self._to_publish:  # only when this task was cancelled
                self._to_publish.popleft()[2].cancel()

    async def subscribe(self, channel: str, on_subscribed: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """``SUBSCRIBE channel`` on a dedicated connection and yield message payloads.

        After an error the connection is dropped and the subscription re-created with Backoff(0.1 s .. 1 s),
        reset by each confirmed subscription (kas.md §3.5). ``on_subscribed`` runs on every confirmation,
        including redis-py's own re-subscription after a reconnect. Messages published while no subscription
        exists are lost (Redis pub/sub has no history).
        """
        # Upstream grows to 10 s (kas.md §3.5); the re-subscription is what triggers the re-write of this kas'
        # state after Redis comes back, so a long delay kept agents unreachable for seconds (issue 9 chaos test).
        backoff = Backoff(initial_s=0.1, max_s=1.0, jitter=0.2)
        while not self._closed:
            pubsub = self._client.pubsub()
            failure: BaseException | None = None
            try:
                await pubsub.subscribe(channel)
                while not self._closed:
                    message: dict[str, Any] | None = await pubsub.get_message(timeout=_SUBSCRIBE_POLL_S)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        backoff.reset()
                        if on_subscribed is not None:
                            on_subscribed()
                    elif message["type"] == "message":
                        yield message["data"]
            except (RedisError, OSError) as exc:
                failure = exc
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            if failure is None or self._closed:
                return
            delay = backoff.next_delay()
            _log.warning("subscription to %r failed (%s); re-subscribing in %.2f s", channel, failure, delay)
            await asyncio.sleep(delay)

    async def get_value(self, key: bytes) -> bytes | None:
        """Return the plain value stored under ``key`` (``GET``), or None."""
        value = await self._client.get(key)
        return value if isinstance(value, bytes) else None

    async def set_value(self, key: bytes, value: bytes, ttl_s: float) -> None:
        """Store a plain value for ``ttl_s`` seconds (``SET key value PX``); used for cached refusals (kas.md §3.4)."""
        await self._client.set(key, value, px=max(1, int(ttl_s * 1000)))

    async def ping(self) -> None:
        """``PING``; raises the client's error when Redis is unreachable."""
        await self._client.ping()

    async def close(self) -> None:
        """Close the connection pool; subscriptions end within about a second."""
        self._closed = True
        await close_client(self._client)
