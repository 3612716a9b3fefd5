"""Agent tracker: which agentk connections (pods) exist, by agent id and by project id (kas.md §3.3).

Redis layout (kas.md §3.3; ``<prefix>`` = kascfg ``redis.key_prefix``, default ``gitlab-kas``):

- ``<prefix>:agent_tracker2:conn_by_agent_id:`` + int64-LE(agent_id): field = connection id (decimal),
  payload = ``ConnectedAgentInfo``;
- ``<prefix>:agent_tracker2:conn_by_project_id:`` + int64-LE(project_id): same fields and payloads;
- ``<prefix>:agent_tracker2:connected_agents`` (one key): field = agent id (decimal), payload empty.

Each value is wrapped in ``ExpiringValue`` (:mod:`tether.tool.expiring_hash`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from google.protobuf.message import DecodeError

from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.event.event_pb2 import AgentConnected, AgentDisconnected
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

_log = logging.getLogger(__name__)


def _identity(key: bytes) -> bytes:
    return key


class AgentTracker:
    """Registers this kas' agentk connections in the backend and answers who is connected (kas.md §3.3).

    Args:
        backend: Redis or memory storage.
        events: where ``AgentConnected`` / ``AgentDisconnected`` are published (seed 000 "For both events kas
            publishes a notification to a pub-sub channel").
        key_prefix: kascfg ``redis.key_prefix``.
        ttl: registration life, refresh and GC periods (``agent.redis_conn_info_*``).
        pod_ttl_s: seconds a pod's ``Register`` entry lives unless the pod registers again (agentk calls every
            300 s, kas.md §3.3; the default leaves a minute of slack).
        kas_url: this kas' private API URL, stamped as ``ConnectedAgentInfo.kas_url`` (a Tether field) on every
            entry it writes, so readers learn which kas replica holds each connection; empty stamps nothing.

    Backend errors (``redis.exceptions.RedisError``, ``OSError``, ``ConnectionError``) propagate from every method
    except :meth:`run`, which logs and retries.
    """

    def __init__(
        self,
        backend: HashBackend,
        events: EventBus,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl: EntryTtl = DEFAULT_ENTRY_TTL,
        pod_ttl_s: float = 360,
        kas_url: str = "",
    ) -> None:
        self._kas_url = kas_url
        base = f"{key_prefix}:agent_tracker2".encode()
        self._by_agent_prefix = base + b":conn_by_agent_id:"
        self._by_project_prefix = base + b":conn_by_project_id:"
        self._connected_agents_key = base + b":connected_agents"
        self._events = events
        self._refresh_s = ttl.refresh_s
        self._gc_s = ttl.gc_s
        # One hash family over all three keys, so a registration is one transaction (seed 000 "transactions").
        self._hash: ExpiringHash[bytes] = ExpiringHash(backend, ttl.ttl_s, _identity)
        # Pods registered through AgentRegistrar.Register live only as long as the pod keeps calling: kas remembers
        # them (to delete them on shutdown) but never refreshes them, and forgets them once expired.
        self._pods: ExpiringHash[bytes] = ExpiringHash(backend, pod_ttl_s, _identity)
        self._pod_ttl_s = pod_ttl_s
        self._pod_written: dict[tuple[bytes, str], float] = {}
        self._backend = backend

    def agent_key(self, agent_id: int) -> bytes:
        """Return the raw key of the ``conn_by_agent_id`` hash of ``agent_id``."""
        return prefixed_int64_key(self._by_agent_prefix, agent_id)

    def project_key(self, project_id: int) -> bytes:
        """Return the raw key of the ``conn_by_project_id`` hash of ``project_id``."""
        return prefixed_int64_key(self._by_project_prefix, project_id)

    @property
    def connected_agents_key(self) -> bytes:
        """The raw key of the ``connected_agents`` hash."""
        return self._connected_agents_key

    async def register_connection(self, info: ConnectedAgentInfo) -> None:
        """Write ``info`` under its agent id, its project id and ``connected_agents`` in ONE transaction.

        Upstream writes the three hashes with separate transactions (kas.md §3.3); seed 000 asks grouped items
        to be written atomically with one expiry. Then publishes ``AgentConnected{info}``; a publish failure is
        logged, not raised (the registration itself succeeded). ``info`` is stamped with this kas' URL.
        """
        self._stamp(info)
        payload = info.SerializeToString()
        connection = str(info.connection_id)
        await self._hash.set_many(
            [
                (self.agent_key(info.agent_id), connection, payload),
                (self.project_key(info.project_id), connection, payload),
                (self._connected_agents_key, str(info.agent_id), b""),
            ]
        )
        await self._publish(AgentConnected(info=info))

    async def unregister_connection(self, info: ConnectedAgentInfo) -> None:
        """HDEL the connection from both ``conn_by_*`` hashes in one transaction; publish ``AgentDisconnected{info}``.

        The ``connected_agents`` field is not deleted (another kas may hold a connection of that agent): it is
        only forgotten, and only when this kas has no other connection of the agent, so it expires by itself
        (kas.md §3.3).
        """
        connection = str(info.connection_id)
        agent_key = self.agent_key(info.agent_id)
        project_key = self.project_key(info.project_id)
        for key in (agent_key, project_key):
            self._pods.forget(key, connection)
            self._pod_written.pop((key, connection), None)
        # One transaction: a failure must not leave the connection listed under one of the two keys.
        await self._hash.unset_many([(agent_key, connection), (project_key, connection)])
        if not self._hash.owned_fields(agent_key):
            self._hash.forget(self._connected_agents_key, str(info.agent_id))
        await self._publish(AgentDisconnected(info=info))

    async def register_pod(self, info: ConnectedAgentInfo) -> None:
        """Write the entry of a pod that registered itself (``AgentRegistrar.Register``), under the same three keys.

        The connection id is the pod's ``pod_id``, so a repeated call overwrites the same entry with a fresh
        expiry (``pod_ttl_s``). Unlike :meth:`register_connection` kas never refreshes the entry: it expires
        unless the pod registers again (upstream fixed its leak of such entries this way, kas.md §3.3 "Known
        issue"). kas remembers it until then only so that :meth:`clear` removes it on shutdown (seed 000).
        Publishes ``AgentConnected{info}``. ``info`` is stamped with this kas' URL.

        Raises:
            the backend's error.
        """
        self._stamp(info)
        payload = info.SerializeToString()
        items = [
            (self.agent_key(info.agent_id), str(info.connection_id), payload),
            (self.project_key(info.project_id), str(info.connection_id), payload),
            (self._connected_agents_key, str(info.agent_id), b""),
        ]
        now = time.monotonic()
        self._forget_expired_pods(now)
        await self._pods.set_many(items)
        for key, field, _ in items:
            self._pod_written[(key, field)] = now
        await self._publish(AgentConnected(info=info))

    def _stamp(self, info: ConnectedAgentInfo) -> None:
        if self._kas_url:
            info.kas_url = self._kas_url

    def _forget_expired_pods(self, now: float) -> None:
        expired = [item for item, written in self._pod_written.items() if now - written > self._pod_ttl_s]
        for key, field in expired:
            del self._pod_written[(key, field)]
            self._pods.forget(key, field)

    async def unregister_agent(self, agent_id: int) -> int:
        """Delete every connection of ``agent_id`` (of any kas): kas learnt its token is no longer valid.

        Returns:
            the number of connections removed.

        Raises:
            the backend's error.
        """
        infos = await self.connections_by_agent_id(agent_id)
        for info in infos:
            await self.unregister_connection(info)
        return len(infos)

    async def connections_by_agent_id(self, agent_id: int) -> list[ConnectedAgentInfo]:
        """Return the live connections of ``agent_id`` registered by any kas, ordered by connection id."""
        return await self._connections(self.agent_key(agent_id))

    async def connections_by_project_id(self, project_id: int) -> list[ConnectedAgentInfo]:
        """Return the live connections of agents of ``project_id``, ordered by (agent id, connection id)."""
        return await self._connections(self.project_key(project_id))

    async def connected_agent_count(self) -> int:
        """Return ``HLEN connected_agents``: agents with a connection in the last TTL (kas.md §3.3 gauge)."""
        return await self._backend.hlen(self._connected_agents_key)

    async def refresh(self) -> int:
        """Rewrite every registration of this kas with a fresh expiry; returns the number of fields written."""
        return await self._hash.refresh()

    async def rebuild(self) -> int:
        """Re-write everything this kas registered, after the store lost it (e.g. Redis restarted empty).

        Unlike the periodic :meth:`refresh` this includes pods' ``Register`` entries that have not expired yet,
        with a fresh expiry. Returns the number of fields written.
        """
        self._forget_expired_pods(time.monotonic())
        return await self._hash.refresh() + await self._pods.refresh()

    async def gc(self) -> int:
        """Delete expired fields (of any kas) from the hashes this kas writes to; returns how many."""
        self._forget_expired_pods(time.monotonic())
        return await self._hash.gc() + await self._pods.gc()

    async def clear(self) -> int:
        """Delete every registration of this kas (clean shutdown, seed 000); returns how many fields it owned.

        That includes the entries of pods registered through this kas that have not expired yet: they come back
        with the pod's next ``Register``, through another kas.
        """
        self._pod_written.clear()
        results = await asyncio.gather(self._hash.clear(), self._pods.clear(), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(r for r in results if isinstance(r, int))

    async def run(self) -> None:
        """Refresh every ``ttl.refresh_s`` and GC every ``ttl.gc_s`` seconds until cancelled; errors are logged."""
        async with asyncio.TaskGroup() as group:
            group.create_task(run_every(self._refresh_s, self.refresh, "agent tracker refresh"))
            group.create_task(run_every(self._gc_s, self.gc, "agent tracker GC"))

    async def _connections(self, key: bytes) -> list[ConnectedAgentInfo]:
        infos: list[ConnectedAgentInfo] = []
        for field, payload in (await self._hash.scan(key)).items():
            try:
                infos.append(ConnectedAgentInfo.FromString(payload))
            except DecodeError:
                _log.warning("undecodable ConnectedAgentInfo in %r field %r; skipped", key, field)
        infos.sort(key=lambda info: (info.agent_id, info.connection_id))
        return infos

    async def _publish(self, event: AgentConnected | AgentDisconnected) -> None:
        try:
            await self._events.publish(event)
        except Exception:
            _log.exception("publishing %s failed", event.DESCRIPTOR.name)
