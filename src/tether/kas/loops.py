"""kas' own background loops, a list run by the supervisor (one restart policy, issue 24 item 3).

The registries' refresh and GC rounds, the event bus subscription, the count of connected agents for
``/metrics``, re-writing this kas' state after Redis came back (maybe empty), registering tunnels whose
registration failed, and closing channels to kas instances that left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tether.kas.services import KasServices, State
from tether.tool.backoff import Backoff
from tether.tool.supervisor import Loop

__all__ = ["AgentCount", "kas_loops"]

log = logging.getLogger(__name__)

#: Seconds between counts of the connected agents (all kas instances).
COUNT_PERIOD_S = 5.0
#: Seconds between checks for channels to kas instances that left.
CLOSE_UNUSED_PERIOD_S = 30.0


class AgentCount:
    """The number of connected agents (all kas instances), read every :data:`COUNT_PERIOD_S` for the gauge."""

    def __init__(self, state: State) -> None:
        self._state = state
        self.value = 0.0

    async def run(self) -> None:
        """Count until cancelled; a failed count keeps the previous value."""
        while True:
            with contextlib.suppress(Exception):
                count = await asyncio.wait_for(self._state.agent_tracker.connected_agent_count(), 1.0)
                self.value = float(count)
            await asyncio.sleep(COUNT_PERIOD_S)


async def _rewrite_state(services: KasServices) -> None:
    state, registry = services.state, services.routing.registry
    backoff = Backoff(initial_s=0.2, max_s=2.0, jitter=0.2)
    while True:
        results = await asyncio.gather(
            state.tunnel_tracker.refresh(),
            registry.register_failed(),
            state.agent_tracker.rebuild(),
            state.instances.refresh(),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            log.info("state re-written after reconnecting to Redis: %s", results)
            return
        delay = backoff.next_delay()
        log.warning("re-writing state after reconnecting to Redis failed (%s); again in %.1f s", failures[0], delay)
        await asyncio.sleep(delay)


async def rebuild_after_reconnect(services: KasServices) -> None:
    """After each re-subscription to Redis, re-write this kas' state until every part succeeded.

    A re-subscription means Redis was unreachable, maybe restarted empty: waiting for the next periodic
    refresh would leave agents unroutable; routing kas instances that wait for our agents are then woken.
    """
    events, tracker = services.state.events, services.state.tunnel_tracker
    seen = 1
    while True:
        await events.wait_subscribed(seen + 1)
        seen = events.subscriptions
        await _rewrite_state(services)
        try:
            await tracker.announce(tracker.registered_agents())
        except Exception as exc:  # best effort: routing kas instances re-read the tracker anyway
            log.warning("announcing this kas' agents after reconnecting to Redis failed: %s", exc)


async def close_unused_channels(services: KasServices) -> None:
    """Close channels to kas instances that left; they would otherwise stay open, reconnecting, forever."""
    while True:
        await asyncio.sleep(CLOSE_UNUSED_PERIOD_S)
        for url in await services.routing.pool.close_unused():
            log.info("closed the channel to kas %s: unused and not connected", url, extra={"kas_url": url})


def kas_loops(services: KasServices, agent_count: AgentCount) -> dict[str, Loop]:
    """Kas' own loops by name, for :meth:`tether.modshared.supervisor.ModuleSupervisor.spawn`."""
    state = services.state
    return {
        "events": state.events.run,
        "tunnel_tracker": state.tunnel_tracker.run,
        "agent_tracker": state.agent_tracker.run,
        "kas_instances": state.instances.run,
        "count_agents": agent_count.run,
        "rebuild_after_reconnect": lambda: rebuild_after_reconnect(services),
        "register_failed_tunnels": services.routing.registry.run,
        "close_unused_kas_channels": lambda: close_unused_channels(services),
    }
