"""Expiring hash: Redis hashes with two-level expiry, and the storage protocol behind them.

Rules (seed 000 "Each bit of information stored in Redis has an expiration time ... kas periodically writes
the same information ... cleans up ... before it terminates ... Grouped data items must have the same
expiration time"; kas.md §3.1):

- every field value is a serialized ``ExpiringValue{expires_at (unix seconds), value}``;
- every write also sets ``PEXPIRE`` on the whole hash key, so data of a crashed kas disappears by itself;
- readers ignore expired fields and delete them lazily; GC deletes them in an optimistic transaction;
- the writer keeps every field it owns in memory and periodically rewrites them with a fresh expiry.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from google.protobuf.message import DecodeError

from tether.pb.gitlab.agent.redistool.redistool_pb2 import ExpiringValue, ExpiringValueTimestamp
from tether.tool.backoff import Backoff

_log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

DEFAULT_KEY_PREFIX = "gitlab-kas"  # kascfg redis.key_prefix default (kas.md §3.2)


@dataclass(frozen=True, slots=True)
class EntryTtl:
    """The life of a Redis-backed registry's entries: one settings object for the three of them (issue 24 item 3).

    kas builds it from ``agent.redis_conn_info_ttl`` / ``_refresh`` / ``_gc`` (kas.md §3.1) for the tunnel
    tracker, the agent tracker and the kas instance registry.

    Attributes:
        ttl_s: seconds an entry lives without refresh (300).
        refresh_s: seconds between refreshes of this kas' own entries (240).
        gc_s: seconds between GC rounds deleting the expired entries of kas instances that died (600).
    """

    ttl_s: float = 300.0
    refresh_s: float = 240.0
    gc_s: float = 600.0


#: The defaults of kas' ``agent.redis_conn_info_*`` settings.
DEFAULT_ENTRY_TTL = EntryTtl()


# A GC transaction that keeps conflicting with writers is retried once, then left to the next round (kas.md §3.1).
GC_ATTEMPTS = 2
#: Keys per refresh transaction: two commands each (HSET, PEXPIRE), so a few hundred commands per pipeline.
REFRESH_BATCH_KEYS = 150
#: Attempts of a registration write before it is given up (and rolled back in memory).
WRITE_ATTEMPTS = 3
#: Most items written by one group commit of :meth:`ExpiringHash.set_many` (each is an HSET; keys get a PEXPIRE).
WRITE_BATCH_ITEMS = 300


def prefixed_int64_key(prefix: bytes, value: int) -> bytes:
    """Return ``prefix`` + the 8 raw bytes of ``value`` as int64 little-endian (kas.md §3.1 PrefixedInt64Key).

    Raises:
        struct.error: ``value`` does not fit in a signed 64-bit integer.
    """
    return prefix + struct.pack("<q", value)


def expires_at_for(now_s: float, ttl_s: float) -> int:
    """Return the ``ExpiringValue.expires_at`` (whole unix seconds) for a field written at ``now_s``.

    Rounded up so that a field lives at least ``ttl_s`` seconds (kas.md §3.1 stores whole seconds).
    """
    return math.ceil(now_s + ttl_s)


def is_expired(expires_at: int, now_s: float) -> bool:
    """Return True when a field with ``expires_at`` (unix seconds) is expired at ``now_s`` (kas.md §3.1)."""
    return expires_at < now_s


def expired_fields(raw: Mapping[str, bytes], now_s: float) -> list[str]:
    """Return the fields of ``raw`` (field -> stored ``ExpiringValue`` bytes) that are expired at ``now_s``.

    Only the timestamp is decoded (``ExpiringValueTimestamp``); undecodable values are logged and left alone,
    as upstream GC does (kas.md §3.1).
    """
    expired: list[str] = []
    for field, stored in raw.items():
        try:
            stamp = ExpiringValueTimestamp.FromString(stored)
        except DecodeError:
            _log.warning("undecodable expiring value in field %r; leaving it", field)
            continue
        if is_expired(stamp.expires_at, now_s):
            expired.append(field)
    return expired


#: A pub/sub message sent in a write's own transaction: ``(channel, payload)`` (:meth:`HashBackend.set_fields`).
Publication = tuple[str, bytes]

GcHook = Callable[[bytes], Awaitable[None]]
"""Test hook a backend awaits during GC between reading the hash and committing the HDEL (argument: the key)."""


class NotReplicated(Exception):
    """A write reached the master but not every replica within its time (it may be lost in a failover)."""


class HashBackend(Protocol):
    """Storage primitive under :class:`ExpiringHash` and the event bus: Redis or process memory.

    Keys are raw bytes (binary, kas.md §3.1 ``PrefixedInt64Key``); fields are text (decimal ids, URLs); values
    are the raw stored bytes (``ExpiringValue`` serializations). Both implementations pass one contract suite
    (``tests/integration/test_state_contract.py``). Redis failures surface as ``redis.exceptions.RedisError``
    or ``OSError``; the memory backend raises ``ConnectionError`` once closed.
    """

    async def set_fields(
        self, writes: Sequence[tuple[bytes, Mapping[str, bytes]]], ttl_s: float, announce: Sequence[Publication] = ()
    ) -> None:
        """Atomically (one ``MULTI/EXEC``) HSET each key's fields, then PEXPIRE that key ``ttl_s`` seconds.

        All keys of one call get the same expiry: grouped items expire together (seed 000, kas.md §3.1). Each
        ``(channel, payload)`` of ``announce`` is published in the same transaction, after the writes: a
        subscriber receives it only once the write is visible, and it costs no round trip of its own.
        """
        ...

    async def set_fields_replicated(
        self, writes: Sequence[tuple[bytes, Mapping[str, bytes]]], ttl_s: float, timeout_s: float
    ) -> None:
        """Like :meth:`set_fields` (without ``MULTI``), then return once every replica of the master has the write.

        For writes that must survive a Sentinel failover (the token revocation list): Redis replicates
        asynchronously, and a write only the old master had is lost when a replica is promoted. Waits up to
        ``timeout_s`` seconds (``WAIT``) for every replica connected to the master at the time.

        Raises:
            NotReplicated: fewer replicas acknowledged the write within ``timeout_s``.
        """
        ...

    async def delete_fields(self, key: bytes, fields: Sequence[str]) -> None:
        """HDEL ``fields`` from ``key``; missing fields or keys are not an error."""
        ...

    async def delete_many(self, deletes: Sequence[tuple[bytes, Sequence[str]]]) -> None:
        """HDEL the fields of several keys atomically (one ``MULTI/EXEC``); missing ones are not an error."""
        ...

    async def scan(self, key: bytes) -> dict[str, bytes]:
        """Return every field of ``key`` with its raw stored value (HSCAN until cursor 0); ``{}`` if missing."""
        ...

    async def gc(self, key: bytes, now_s: float) -> int:
        """Delete the fields of ``key`` expired at ``now_s`` (unix seconds) in an optimistic transaction.

        ``WATCH``, scan, ``MULTI HDEL EXEC``; on a conflict retry once (at most :data:`GC_ATTEMPTS` attempts),
        then give up and return 0. Undecodable values are left alone (kas.md §3.1).

        Returns:
            the number of fields deleted.
        """
        ...

    async def hlen(self, key: bytes) -> int:
        """Return the number of fields of ``key`` (expired ones included, like ``HLEN``)."""
        ...

    async def publish(self, channel: str, payload: bytes) -> None:
        """Publish ``payload`` on ``channel`` to every current subscriber (kas.md §3.5)."""
        ...

    def subscribe(self, channel: str, on_subscribed: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """Iterate over payloads published on ``channel`` after the subscription is registered.

        ``on_subscribed`` is called each time the subscription is (re-)established, so callers know from when
        on messages are seen. The iterator survives backend errors (Redis: reconnects with backoff 0.1 s to
        1 s, logging each failure; upstream 10 s, kas.md §3.5) and ends only when cancelled or the backend closed.
        """
        ...

    async def get_value(self, key: bytes) -> bytes | None:
        """Return the plain value under ``key`` or None (Redis ``GET``)."""
        ...

    async def set_value(self, key: bytes, value: bytes, ttl_s: float) -> None:
        """Store a plain value for ``ttl_s`` seconds (Redis ``SET ... PX``)."""
        ...

    async def ping(self) -> None:
        """Check the backend is reachable (the readiness probe, kas.md §3.1); raises on failure."""
        ...

    async def close(self) -> None:
        """Release connections; running subscriptions end."""
        ...


@dataclass(eq=False)
class _QueuedWrite(Generic[K]):
    """One :meth:`ExpiringHash.set_many` call waiting for its group commit."""

    entries: list[tuple[K, str, bytes]]
    announce: Sequence[Publication]
    done: asyncio.Future[None]
    abandoned: bool = False


class ExpiringHash(Generic[K]):
    """The fields one process wrote into one family of expiring hashes, mirrored in memory (kas.md §3.1).

    ``key_for`` maps a key id (e.g. an agent id) to the raw hash key. The in-memory copy is what
    :meth:`refresh` rewrites, which also rebuilds the data after the backend lost it (e.g. a Redis restart).
    Writes are serialized by a lock so that a refresh never resurrects a field being unset.

    Args:
        backend: where the hashes live.
        ttl_s: seconds until a written field (and its key) expires, e.g. 300 (kas.md §3.2, §3.3).
        key_for: key id -> raw hash key bytes.
        clock: unix time in seconds, for the per-field ``expires_at``; injectable for tests.
    """

    def __init__(
        self,
        backend: HashBackend,
        ttl_s: float,
        key_for: Callable[[K], bytes],
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._backend = backend
        self._ttl_s = ttl_s
        self._key_for = key_for
        self._clock = clock
        self._owned: dict[K, dict[str, bytes]] = {}
        self._lock = asyncio.Lock()
        self._queued: deque[_QueuedWrite[K]] = deque()
        self._writer: asyncio.Task[None] | None = None
        # Fields unset while a refresh runs: the refresh may have rewritten them and deletes them again.
        self._refreshing = 0
        self._unset_during_refresh: set[tuple[K, str]] = set()

    @property
    def ttl_s(self) -> float:
        """Seconds a written field lives without a refresh."""
        return self._ttl_s

    def key(self, key_id: K) -> bytes:
        """Return the raw hash key of ``key_id``."""
        return self._key_for(key_id)

    async def set(self, key_id: K, field: str, value: bytes, announce: Sequence[Publication] = ()) -> None:
        """Own ``field`` of ``key_id`` with payload ``value`` (bytes) and write it now; see :meth:`set_many`."""
        await self.set_many([(key_id, field, value)], announce)

    async def set_many(self, items: Iterable[tuple[K, str, bytes]], announce: Sequence[Publication] = ()) -> None:
        """Own and write several ``(key_id, field, value)`` items in ONE transaction with one expiry (seed 000).

        Calls made while a write is in flight are written together in the next transaction (group commit, at
        most :data:`WRITE_BATCH_ITEMS` items): a storm of registrations then costs one round trip per batch
        instead of one each behind the lock (issue 9: 10,000 agents connecting). A failed write is retried
        (:data:`WRITE_ATTEMPTS` attempts with a short backoff, so an agent does not stay unreachable from other
        kas until the next refresh); when every attempt fails, the items are given up in memory too, so no
        registration that failed is refreshed forever (issue 9 item 3). A caller cancelled while its items wait
        or are written gives them up in memory as well (they expire by themselves). ``announce`` is published in
        the transaction that writes the items (:meth:`HashBackend.set_fields`); a retried write publishes again.

        Raises:
            the backend's last error when every attempt failed.
        """
        entries = list(items)
        if not entries:
            return
        write = _QueuedWrite(entries, announce, asyncio.get_running_loop().create_future())
        self._queued.append(write)
        if self._writer is None:
            # A context of its own: its log lines are not the first caller's (agent_id, connection_id).
            self._writer = asyncio.create_task(self._write_queued(), context=contextvars.Context())
        try:
            await asyncio.shield(write.done)
        except asyncio.CancelledError:
            write.abandoned = True
            raise

    async def _write_queued(self) -> None:
        try:
            while self._queued:
                batch: list[_QueuedWrite[K]] = []
                size = 0
                while self._queued and (not batch or size + len(self._queued[0].entries) <= WRITE_BATCH_ITEMS):
                    write = self._queued.popleft()
                    if not write.abandoned:
                        batch.append(write)
                        size += len(write.entries)
                if batch:
                    await self._commit(batch)
        finally:
            self._writer = None
            while self._queued:  # only when this task was cancelled
                self._queued.popleft().done.cancel()

    async def _commit(self, batch: list[_QueuedWrite[K]]) -> None:
        entries = [entry for write in batch for entry in write.entries]
        announce = [publication for write in batch for publication in write.announce]
        async with self._lock:
            previous = [(key_id, field, self._owned.get(key_id, {}).get(field)) for key_id, field, _ in entries]
            for key_id, field, value in entries:
                self._owned.setdefault(key_id, {})[field] = value
                self._unset_during_refresh.discard((key_id, field))
            try:
                await self._retrying(lambda: self._write(entries, self._clock(), announce))
            except Exception as exc:
                self._restore(previous)
                for write in batch:
                    if not write.abandoned and not write.done.done():
                        write.done.set_exception(exc)
                return
            except BaseException:
                self._restore(previous)
                for write in batch:
                    write.done.cancel()
                raise
            for write in batch:
                if write.abandoned:
                    self._restore([(key_id, field, None) for key_id, field, _ in write.entries])
                elif not write.done.done():
                    write.done.set_result(None)

    def _restore(self, previous: Iterable[tuple[K, str, bytes | None]]) -> None:
        for key_id, field, old in reversed(list(previous)):
            if old is None:
                self.forget(key_id, field)
            else:
                self._owned.setdefault(key_id, {})[field] = old

    async def unset(self, key_id: K, field: str) -> None:
        """Stop owning ``field`` of ``key_id`` and HDEL it now; see :meth:`unset_many`."""
        await self.unset_many([(key_id, field)])

    async def unset_many(self, items: Iterable[tuple[K, str]]) -> None:
        """Stop owning several ``(key_id, field)`` items and HDEL them in ONE transaction (retried like writes).

        Raises:
            the backend's last error; the fields are forgotten anyway and expire by themselves.
        """
        pairs = list(items)
        if not pairs:
            return
        async with self._lock:
            grouped: dict[bytes, list[str]] = {}
            for key_id, field in pairs:
                self.forget(key_id, field)
                if self._refreshing:
                    self._unset_during_refresh.add((key_id, field))
                grouped.setdefault(self._key_for(key_id), []).append(field)
            await self._retrying(lambda: self._backend.delete_many(list(grouped.items())))

    async def _retrying(self, write: Callable[[], Awaitable[None]]) -> None:
        backoff = Backoff(initial_s=0.05, max_s=0.5, jitter=0.5)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                await write()
                return
            except Exception as exc:
                if attempt == WRITE_ATTEMPTS:
                    raise
                delay = backoff.next_delay()
                _log.warning("state write failed (%s); retry %d in %.2f s", exc, attempt, delay)
                await asyncio.sleep(delay)

    def forget(self, key_id: K, field: str) -> None:
        """Stop owning ``field`` of ``key_id`` without touching the backend: it expires after the TTL."""
        fields = self._owned.get(key_id)
        if fields is None:
            return
        fields.pop(field, None)
        if not fields:
            del self._owned[key_id]

    def owned_fields(self, key_id: K) -> frozenset[str]:
        """Return the fields of ``key_id`` this process owns."""
        return frozenset(self._owned.get(key_id, ()))

    def owned_keys(self) -> list[K]:
        """Return the key ids under which this process owns at least one field."""
        return list(self._owned)

    def owned_count(self) -> int:
        """Return the number of (key, field) items this process owns."""
        return sum(len(fields) for fields in self._owned.values())

    async def scan(self, key_id: K) -> dict[str, bytes]:
        """Return field -> payload (the ``ExpiringValue.value`` bytes) of every unexpired field of ``key_id``.

        Fields of every writer are returned, not only owned ones. Expired fields are removed with one HDEL;
        undecodable values are skipped and left alone (kas.md §3.1).

        Raises:
            the backend's error.
        """
        key = self._key_for(key_id)
        raw = await self._backend.scan(key)
        now_s = self._clock()
        live: dict[str, bytes] = {}
        expired: list[str] = []
        for field, stored in raw.items():
            try:
                decoded = ExpiringValue.FromString(stored)
            except DecodeError:
                _log.warning("undecodable expiring value in %r field %r; skipping it", key, field)
                continue
            if is_expired(decoded.expires_at, now_s):
                expired.append(field)
            else:
                live[field] = decoded.value
        if expired:
            await self._backend.delete_fields(key, expired)
        return live

    async def refresh(self, now_s: float | None = None) -> int:
        """Rewrite every owned field with ``expires_at = now + ttl`` and re-PEXPIRE its key, in bounded batches.

        Unlike upstream (which skips fields that stay valid past the next refresh, kas.md §3.1) every field is
        rewritten: grouped items keep one expiry (seed 000) and data lost by the backend is fully rebuilt. Each
        batch is one transaction of at most :data:`REFRESH_BATCH_KEYS` keys, and no lock is held across the
        network: registrations go on meanwhile. A field unset while its batch was in flight is deleted again
        right after the batch, and one re-set with a new value is written again, so a refresh never resurrects
        or reverts anything.

        Args:
            now_s: unix time in seconds to compute the expiry from; None means the clock.

        Returns:
            the number of fields written.

        Raises:
            the backend's error (batches after the failing one are not written).
        """
        snapshot = [(key_id, dict(fields)) for key_id, fields in self._owned.items()]
        written = 0
        self._refreshing += 1
        try:
            for start in range(0, len(snapshot), REFRESH_BATCH_KEYS):
                batch = snapshot[start : start + REFRESH_BATCH_KEYS]
                entries = [(key_id, field, value) for key_id, fields in batch for field, value in fields.items()]
                await self._write(entries, self._clock() if now_s is None else now_s)
                written += len(entries)
                await self._repair(entries)
        finally:
            self._refreshing -= 1
            if not self._refreshing:
                self._unset_during_refresh.clear()
        return written

    async def _repair(self, entries: Sequence[tuple[K, str, bytes]]) -> None:
        async with self._lock:
            stale: list[tuple[K, str]] = []
            changed: list[tuple[K, str, bytes]] = []
            for key_id, field, value in entries:
                current = self._owned.get(key_id, {}).get(field)
                if current is None and (key_id, field) in self._unset_during_refresh:
                    stale.append((key_id, field))
                elif current is not None and current != value:
                    changed.append((key_id, field, current))
            if changed:
                await self._write(changed, self._clock())
            if stale:
                grouped: dict[bytes, list[str]] = {}
                for key_id, field in stale:
                    grouped.setdefault(self._key_for(key_id), []).append(field)
                await self._backend.delete_many(list(grouped.items()))

    async def gc(self) -> int:
        """Delete expired fields of every other writer from the keys this process owns (kas.md §3.1 GC).

        Returns:
            the number of fields deleted.

        Raises:
            the backend's error (keys after the failing one are not visited).
        """
        deleted = 0
        for key_id in list(self._owned):
            deleted += await self._backend.gc(self._key_for(key_id), self._clock())
        return deleted

    async def clear(self) -> int:
        """Delete every owned field from the backend and forget them (clean shutdown, seed 000).

        Keys are deleted concurrently; every key is attempted even when one fails.

        Returns:
            the number of fields that were owned.

        Raises:
            the first backend error, after all deletions were attempted.
        """
        async with self._lock:
            owned, self._owned = self._owned, {}
            results = await asyncio.gather(
                *(self._backend.delete_fields(self._key_for(key_id), list(fields)) for key_id, fields in owned.items()),
                return_exceptions=True,
            )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(len(fields) for fields in owned.values())

    async def _write(
        self, entries: Sequence[tuple[K, str, bytes]], now_s: float, announce: Sequence[Publication] = ()
    ) -> None:
        expires_at = expires_at_for(now_s, self._ttl_s)
        grouped: dict[bytes, dict[str, bytes]] = {}
        for key_id, field, value in entries:
            stored = ExpiringValue(expires_at=expires_at, value=value).SerializeToString()
            grouped.setdefault(self._key_for(key_id), {})[field] = stored
        await self._backend.set_fields(list(grouped.items()), self._ttl_s, announce)


async def run_every(period_s: float, action: Callable[[], Awaitable[object]], what: str) -> None:
    """Await ``action`` every ``period_s`` seconds until cancelled (refresh and GC loops, kas.md §3.2, §3.3).

    A failure is logged and retried sooner, with backoff from 1 s up to 5 s (or ``period_s`` if shorter), so
    a backend outage does not let owned data expire, and its end is noticed within seconds.
    """
    backoff = Backoff(initial_s=min(1.0, period_s), max_s=min(5.0, period_s), jitter=0.2)
    delay = period_s
    while True:
        await asyncio.sleep(delay)
        try:
            await action()
        except Exception:
            delay = min(backoff.next_delay(), period_s)
            _log.exception("%s failed; retrying in %.1f s", what, delay)
        else:
            backoff.reset()
            delay = period_s
