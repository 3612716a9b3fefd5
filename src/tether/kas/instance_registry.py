"""kas instance registry: every kas advertises itself so others can discover it.

Seed 000: "Each kas instance puts information about itself into Redis so that other kas instances can discover and
access it".

A Tether addition: upstream has no such key and is discovered only through the tunnel tracker (kas.md §3.6).
Layout: hash ``<prefix>:kas_instances``; field = the kas' private API URL; payload = ``KasInstanceInfo`` wrapped in
``ExpiringValue`` with the usual TTL and refresh (kas.md §3.1).
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import DecodeError

from tether.pb.gitlab.agent.kas.instance_pb2 import KasInstanceInfo
from tether.tool.expiring_hash import (
    DEFAULT_ENTRY_TTL,
    DEFAULT_KEY_PREFIX,
    EntryTtl,
    ExpiringHash,
    HashBackend,
    run_every,
)

_log = logging.getLogger(__name__)


class KasInstanceRegistry:
    """Writes this kas' ``KasInstanceInfo`` with expiry and refresh, and lists the live instances.

    Args:
        backend: Redis or memory storage.
        key_prefix: kascfg ``redis.key_prefix``.
        ttl: entry life, refresh and GC periods (``agent.redis_conn_info_*``).

    Backend errors propagate from every method except :meth:`run`, which logs and retries.
    """

    def __init__(
        self,
        backend: HashBackend,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl: EntryTtl = DEFAULT_ENTRY_TTL,
    ) -> None:
        self._gc_s = ttl.gc_s
        self._key = f"{key_prefix}:kas_instances".encode()
        self._refresh_s = ttl.refresh_s
        self._hash: ExpiringHash[None] = ExpiringHash(backend, ttl.ttl_s, lambda _: self._key)

    @property
    def key(self) -> bytes:
        """The raw hash key."""
        return self._key

    async def register(self, info: KasInstanceInfo) -> None:
        """Write ``info`` under its ``private_api_url`` (replacing an earlier registration of that URL).

        Raises:
            ValueError: ``info.private_api_url`` is empty.
        """
        if not info.private_api_url:
            raise ValueError("KasInstanceInfo.private_api_url must be set")
        await self._hash.set(None, info.private_api_url, info.SerializeToString())

    async def instances(self) -> list[KasInstanceInfo]:
        """Return the live instances (any kas), ordered by private API URL; expired entries are pruned lazily."""
        found: list[KasInstanceInfo] = []
        for url, payload in sorted((await self._hash.scan(None)).items()):
            try:
                found.append(KasInstanceInfo.FromString(payload))
            except DecodeError:
                _log.warning("undecodable KasInstanceInfo for %r; skipped", url)
        return found

    async def refresh(self) -> int:
        """Rewrite this kas' entry with a fresh expiry; returns the number of entries written (0 or 1)."""
        return await self._hash.refresh()

    async def clear(self) -> int:
        """Delete this kas' entry (clean shutdown, seed 000); returns how many entries it owned."""
        return await self._hash.clear()

    async def gc(self) -> int:
        """Delete the expired entries (kas instances that died without clean-up); returns how many."""
        return await self._hash.gc()

    async def run(self) -> None:
        """Refresh every ``ttl.refresh_s``, GC every ``ttl.gc_s`` seconds until cancelled; errors logged, retried."""
        async with asyncio.TaskGroup() as group:
            group.create_task(run_every(self._refresh_s, self.refresh, "kas instance registry refresh"))
            group.create_task(run_every(self._gc_s, self.gc, "kas instance registry GC"))
