"""In-process :class:`~tether.tool.expiring_hash.HashBackend`: the embedded default for a single kas without Redis.

It mirrors the Redis semantics the contract suite checks (kas.md §3.1, §3.5): per-key expiry, raw field
values, GC with a WATCH-like conflict check, and pub/sub to subscribers registered before a publish.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tether.tool.expiring_hash import GC_ATTEMPTS, GcHook, Publication, expired_fields


@dataclass
class _Hash:
    fields: dict[str, bytes] = field(default_factory=dict)
    deadline: float | None = None  # on the backend's monotonic clock; None = no expiry


class MemoryBackend:
    """Hashes, key expiry and pub/sub in process memory, with the Redis semantics of kas.md §3.1 and §3.5.

    Args:
        clock: monotonic seconds for key expiry (Redis' own clock in the Redis backend); injectable for tests.
        gc_before_exec: test hook awaited in :meth:`gc` between the scan and the delete, where another
            writer can cause a conflict exactly as with Redis ``WATCH``.

    After :meth:`close` every operation raises ``ConnectionError`` and subscriptions end.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, gc_before_exec: GcHook | None = None) -> None:
        self._clock = clock
        self._gc_before_exec = gc_before_exec
        self._hashes: dict[bytes, _Hash] = {}
        # Bumped on every change of a key, expiry included: what Redis WATCH observes.
        self._versions: dict[bytes, int] = {}
        self._subscribers: dict[str, set[asyncio.Queue[bytes | None]]] = {}
        self._values: dict[bytes, tuple[float, bytes]] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionError("memory backend is closed")

    def _touch(self, key: bytes) -> None:
        self._versions[key] = self._versions.get(key, 0) + 1

    def _live(self, key: bytes) -> _Hash | None:
        entry = self._hashes.get(key)
        if entry is not None and entry.deadline is not None and entry.deadline <= self._clock():
            del self._hashes[key]
            self._touch(key)
            return None
        return entry

    async def set_fields(
        self, writes: Sequence[tuple[bytes, Mapping[str, bytes]]], ttl_s: float, announce: Sequence[Publication] = ()
    ) -> None:
        """HSET each key's fields, expire each key after ``ttl_s`` s, publish ``announce``; atomically (no await)."""
        self._check_open()
        deadline = self._clock() + ttl_s  # one instant for the whole group: grouped items expire together
        for key, fields in writes:
            entry = self._live(key)
            if entry is None:
                entry = self._hashes[key] = _Hash()
            entry.fields.update(fields)
            entry.deadline = deadline
            self._touch(key)
        for channel, payload in announce:
            self._deliver(channel, payload)

    async def set_fields_replicated(
        self, writes: Sequence[tuple[bytes, Mapping[str, bytes]]], ttl_s: float, timeout_s: float
    ) -> None:
        """:meth:`set_fields`: process memory has no replicas."""
        await self.set_fields(writes, ttl_s)

    async def delete_fields(self, key: bytes, fields: Sequence[str]) -> None:
        """HDEL ``fields`` of ``key``; an emptied hash disappears, as in Redis."""
        self._check_open()
        entry = self._live(key)
        if entry is None:
            return
        for name in fields:
            entry.fields.pop(name, None)
        if not entry.fields:
            del self._hashes[key]
        self._touch(key)

    async def delete_many(self, deletes: Sequence[tuple[bytes, Sequence[str]]]) -> None:
        """HDEL the fields of several keys, atomically (no await inside)."""
        self._check_open()
        for key, fields in deletes:
            await self.delete_fields(key, fields)

    async def scan(self, key: bytes) -> dict[str, bytes]:
        """Return a copy of the fields of ``key`` (raw stored bytes); ``{}`` if missing or expired."""
        self._check_open()
        entry = self._live(key)
        return dict(entry.fields) if entry is not None else {}

    async def gc(self, key: bytes, now_s: float) -> int:
        """Delete fields of ``key`` expired at ``now_s`` (unix s); a change during the hook is a conflict.

        At most :data:`GC_ATTEMPTS` attempts, then 0 (kas.md §3.1).
        """
        for _attempt in range(GC_ATTEMPTS):
            self._check_open()
            entry = self._live(key)
            if entry is None:
                return 0
            version = self._versions.get(key, 0)
            expired = expired_fields(entry.fields, now_s)
            if not expired:
                return 0
            if self._gc_before_exec is not None:
                await self._gc_before_exec(key)
            self._check_open()
            if self._versions.get(key, 0) != version or self._live(key) is None:
                continue
            await self.delete_fields(key, expired)
            return len(expired)
        return 0

    async def hlen(self, key: bytes) -> int:
        """Return the number of fields of ``key`` (0 if missing or expired)."""
        self._check_open()
        entry = self._live(key)
        return len(entry.fields) if entry is not None else 0

    async def publish(self, channel: str, payload: bytes) -> None:
        """Queue ``payload`` for every subscriber of ``channel`` registered now."""
        self._check_open()
        self._deliver(channel, payload)

    def _deliver(self, channel: str, payload: bytes) -> None:
        for queue in self._subscribers.get(channel, ()):
            queue.put_nowait(payload)

    async def subscribe(self, channel: str, on_subscribed: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """Yield payloads published on ``channel`` after the first ``__anext__``; ends on :meth:`close`."""
        self._check_open()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        subscribers = self._subscribers.setdefault(channel, set())
        subscribers.add(queue)
        try:
            if on_subscribed is not None:
                on_subscribed()
            while (payload := await queue.get()) is not None:
                yield payload
        finally:
            subscribers.discard(queue)

    async def get_value(self, key: bytes) -> bytes | None:
        """Return the plain value stored under ``key``, or None when absent or expired (Redis ``GET``)."""
        self._check_open()
        entry = self._values.get(key)
        if entry is None or entry[0] <= self._clock():
            self._values.pop(key, None)
            return None
        return entry[1]

    async def set_value(self, key: bytes, value: bytes, ttl_s: float) -> None:
        """Store a plain value for ``ttl_s`` seconds (Redis ``SET key value PX``)."""
        self._check_open()
        self._values[key] = (self._clock() + ttl_s, value)

    async def ping(self) -> None:
        """Raise ``ConnectionError`` once closed."""
        self._check_open()

    async def close(self) -> None:
        """Close: later operations raise ``ConnectionError``; subscriptions end after queued payloads."""
        self._closed = True
        for queues in self._subscribers.values():
            for queue in queues:
                queue.put_nowait(None)

    def flushall(self) -> None:
        """Drop every key, like Redis ``FLUSHALL`` or a Redis restart without persistence (tests use it)."""
        for key in self._hashes:
            self._touch(key)
        self._hashes.clear()

    def pexpiretime(self, key: bytes) -> int:
        """Return the expiry instant of ``key`` in ms on the backend clock, like ``PEXPIRETIME``.

        Returns:
            -2 when the key is missing, -1 when it has no expiry.
        """
        entry = self._live(key)
        if entry is None:
            return -2
        if entry.deadline is None:
            return -1
        return round(entry.deadline * 1000)
