"""Tunnel tracker: which kas instances hold tunnels of which agent (kas.md §3.2).

Key ``<prefix>:tunnel_tracker2:kas_by_agent_id:`` + int64-LE(agent_id); field = a kas' private API URL; value =
``ExpiringValue{expires_at, value = empty}``. The 5 s delayed unregistration (kas.md §1.6) belongs to the kas
tunnel registry that calls :meth:`TunnelTracker.unregister`, not here.

Reads (:meth:`TunnelTracker.kas_urls`) run on a routed request's path, so they go through a
:class:`~tether.tool.circuit_breaker.CircuitBreaker` (issue 27 item 5): a request that stops waiting for one
returns at once, and while Redis stalls they fail at once instead of holding pool connections. redis-py does not
always end a cancelled command promptly: one cancelled while a new connection to a frozen Redis sends its
handshake went on until the 3 s socket timeout, and the routing kas waited for it past the request's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tether.pb.gitlab.agent.event.event_pb2 import TunnelsAvailable
from tether.tool.circuit_breaker import CircuitBreaker
from tether.tool.events import EventBus
from tether.tool.expiring_hash import (
    DEFAULT_ENTRY_TTL,
    DEFAULT_KEY_PREFIX,
    EntryTtl,
    ExpiringHash,
    HashBackend,
    prefixed_int64_key,
    run_every,
)


class TunnelTracker:
    """Advertises in the backend that this kas has tunnels of an agent, and lists the kas URLs of an agent.

    Args:
        backend: Redis or memory storage.
        events: where ``TunnelsAvailable`` is published on registration, so routing kas instances waiting for the
            agent wake up (seed 000 "kas is notified of new agent connections via a pub-sub channel").
        own_url: this kas' private API URL, e.g. ``grpc://10.0.0.5:8155`` (kas.md §2.7).
        key_prefix: kascfg ``redis.key_prefix``.
        ttl: entry life, refresh and GC periods (``agent.redis_conn_info_*``); GC deletes expired fields of
            other (dead) kas instances from the keys this kas writes (kas.md §3.1).

    Backend errors propagate from every method except :meth:`run`, which logs and retries.
    """

    def __init__(
        self,
        backend: HashBackend,
        events: EventBus,
        own_url: str,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl: EntryTtl = DEFAULT_ENTRY_TTL,
    ) -> None:
        self._gc_s = ttl.gc_s
        self._prefix = f"{key_prefix}:tunnel_tracker2:kas_by_agent_id:".encode()
        self._events = events
        self._own_url = own_url
        self._refresh_s = ttl.refresh_s
        self._hash: ExpiringHash[int] = ExpiringHash(backend, ttl.ttl_s, self.agent_key)
        self._reads = CircuitBreaker("tunnel_tracker", backend.ping)

    @property
    def own_url(self) -> str:
        """Return this kas' private API URL (the field it writes)."""
        return self._own_url

    def agent_key(self, agent_id: int) -> bytes:
        """Return the raw key of the ``kas_by_agent_id`` hash of ``agent_id``."""
        return prefixed_int64_key(self._prefix, agent_id)

    async def register(self, agent_id: int) -> None:
        """HSET own URL + PEXPIRE + PUBLISH ``TunnelsAvailable{agent_id, kas_url}`` in one ``MULTI/EXEC``.

        Called for the first tunnel of an agent on this kas (kas.md §1.6, §3.2). The event is part of the write's
        transaction, so a kas it wakes already reads the entry, and it costs no round trip of its own (upstream
        publishes after the write; one Redis round trip less per waking agent, issue 28 items 3 and 5).

        Raises:
            the backend's error when the write (and with it the event) failed.
        """
        event = TunnelsAvailable(agent_id=agent_id, kas_url=self._own_url)
        await self._hash.set(agent_id, self._own_url, b"", announce=[self._events.publication(event)])

    async def unregister(self, agent_id: int) -> None:
        """HDEL this kas' field of ``agent_id`` (kas.md §3.2)."""
        await self._hash.unset(agent_id, self._own_url)

    async def kas_urls(self, agent_id: int) -> list[str]:
        """Return the sorted private API URLs of the kas instances with tunnels of ``agent_id``.

        Expired fields are skipped and pruned lazily (kas.md §3.2 "Query").

        Raises:
            CircuitOpen: the backend stalled or failed during this read or recently (the read was not made, or
                was given up); it is probed in the background until it answers.
            Exception: the backend's error (the circuit opens).
        """
        return sorted(await self._reads.call(lambda: self._hash.scan(agent_id)))

    async def prime(self) -> None:
        """Ask the backend once at start (:meth:`~tether.tool.circuit_breaker.CircuitBreaker.prime`)."""
        await self._reads.prime()

    async def close(self) -> None:
        """Stop probing a stalled backend (its owner closes it)."""
        await self._reads.close()

    def registered_agents(self) -> frozenset[int]:
        """Return the agent ids this kas currently advertises."""
        return frozenset(self._hash.owned_keys())

    async def refresh(self) -> int:
        """Rewrite this kas' entries with a fresh expiry; returns the number of entries written."""
        return await self._hash.refresh()

    async def announce(self, agent_ids: Iterable[int]) -> None:
        """Publish ``TunnelsAvailable`` for each of ``agent_ids`` (after this kas' entries were written again).

        A routing kas waiting for one of these agents tries at once instead of at its next tracker re-read.
        Raises the backend's error.
        """
        for agent_id in agent_ids:
            await self._events.publish(TunnelsAvailable(agent_id=agent_id, kas_url=self._own_url))

    async def clear(self) -> int:
        """Delete all entries of this kas (shutdown, kas.md §1.6 "Redis entries for all agents are deleted")."""
        return await self._hash.clear()

    async def gc(self) -> int:
        """Delete expired fields (those of kas instances that died) from the keys this kas writes; how many."""
        return await self._hash.gc()

    async def run(self) -> None:
        """Refresh every ``ttl.refresh_s``, GC every ``ttl.gc_s`` seconds until cancelled; errors logged, retried."""
        async with asyncio.TaskGroup() as group:
            group.create_task(run_every(self._refresh_s, self.refresh, "tunnel tracker refresh"))
            group.create_task(run_every(self._gc_s, self.gc, "tunnel tracker GC"))
