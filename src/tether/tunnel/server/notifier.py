"""Wakes the requests waiting for an agent when some kas announces tunnels of it.

Seed 000: "kas is notified of new agent connections via a pub-sub channel to avoid frequent polling".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class TunnelNotifier:
    """In-process fan-out of ``TunnelsAvailable`` events to the requests of this kas waiting per agent."""

    def __init__(self) -> None:
        self._watchers: dict[int, set[asyncio.Queue[str]]] = {}

    def notify(self, agent_id: int, kas_url: str) -> None:
        """Deliver ``kas_url`` to every request of this kas waiting for ``agent_id``."""
        for queue in self._watchers.get(agent_id, ()):
            queue.put_nowait(kas_url)

    @contextmanager
    def watch(self, agent_id: int) -> Iterator[asyncio.Queue[str]]:
        """Receive kas URLs announced for ``agent_id`` while the context is open."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._watchers.setdefault(agent_id, set()).add(queue)
        try:
            yield queue
        finally:
            watchers = self._watchers[agent_id]
            watchers.discard(queue)
            if not watchers:
                del self._watchers[agent_id]

    def waiting_agents(self) -> int:
        """Number of agents with at least one waiting request."""
        return len(self._watchers)
