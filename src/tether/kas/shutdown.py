"""kas' drain on SIGTERM (kas.md §8.6; issue 26 item 3 "rolling update without a failed request").

Called after ``agent.listen.listen_grace_period``: the agent and api listeners stop accepting (GOAWAY), the
agents move to other kas instances make-before-break (at most ``routing.agent_move_timeout``; not at all for
a lone kas), this kas' Redis entries go, the private listener stops accepting, and in-flight forwarded calls
get what remains of ``routing.shutdown_grace_period``. Then every tunnel still open ends with OK, before the
agent listener's own grace runs out :data:`TUNNEL_MARGIN_S` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from tether.kas.config import KasConfig
from tether.kas.listeners import GrpcListeners
from tether.kas.services import KasServices, State
from tether.tool.tasks import wait_or_abandon

__all__ = ["drain"]

log = logging.getLogger(__name__)

#: Seconds a Redis read of the drain may take before it goes on without the answer (the work is abandoned, not
#: waited for: see ``tool/tasks.py``).
READ_TIMEOUT_S = 2.0
#: Seconds the agent listener's grace outlasts the others'. The api and private listeners cancel the calls they
#: relay at the end of their grace, and the drain then ends the tunnels left with OK; gRPC cancelling a tunnel
#: itself at the end of the agent listener's grace ends it with UNAVAILABLE, and agentk backs off before it
#: reconnects. With equal graces the two raced (test_shutdown_watch[gateway_kas] lost it 3 times in 5 under load).
TUNNEL_MARGIN_S = 1.0


async def _has_tunnels_elsewhere(state: State, own_url: str, agent_id: int) -> bool:
    try:
        urls = await wait_or_abandon(state.tunnel_tracker.kas_urls(agent_id), READ_TIMEOUT_S)
    except Exception:
        return False  # then one tunnel moves and the others wait for the announcement
    return any(url != own_url for url in urls)


async def _other_instances(state: State, own_url: str) -> bool:
    try:
        listed = await wait_or_abandon(state.instances.instances(), READ_TIMEOUT_S)
    except Exception:
        return True  # unknown: give the agents their chance to move
    return any(info.private_api_url != own_url for info in listed)


async def _forget_instance(state: State) -> None:
    with contextlib.suppress(Exception):
        await wait_or_abandon(state.instances.clear(), READ_TIMEOUT_S)  # other kas stop discovering this one


async def _move_agents(config: KasConfig, services: KasServices, grace_ends: float) -> None:
    routing, state, own_url = config.routing, services.state, services.own_url
    # At once: with Redis stalled each gives up after READ_TIMEOUT_S, and one after the other they added up.
    others, _ = await asyncio.gather(_other_instances(state, own_url), _forget_instance(state))
    # The move is part of the grace period, Redis reads included: it never makes the drain outlast it.
    move_timeout = min(routing.agent_move_timeout, max(grace_ends - time.monotonic(), 0.0))
    if not others:
        move_timeout = 0.0  # a lone kas: its agents have nowhere to move, waiting would only delay its stop

    async def moved(agent_id: int) -> bool:
        return await _has_tunnels_elsewhere(state, own_url, agent_id)

    unmoved = await services.routing.registry.drain(moved, move_timeout)
    log.info("agents moved to other kas instances (%d had not within %.1f s)", unmoved, move_timeout)


async def drain(config: KasConfig, services: KasServices, listeners: GrpcListeners) -> None:
    """Stop the listeners and move the agents away as described in the module docstring."""
    grace_s = config.routing.shutdown_grace_period
    grace_ends = time.monotonic() + grace_s
    # No new agent connections or hub calls from now on: they go to another kas.
    agent_stopping = asyncio.ensure_future(listeners.agent.stop(grace_s + TUNNEL_MARGIN_S))
    stopping = [asyncio.ensure_future(listeners.api.stop(grace_s))]
    await _move_agents(config, services, grace_ends)
    registry = services.routing.registry
    await registry.stop()
    stopping.append(asyncio.ensure_future(listeners.private.stop(max(grace_ends - time.monotonic(), 0.0))))
    # This kas' Redis entries go while the listeners stop; a stalled Redis must not hold up the tunnels' clean end
    # (its entries expire by their TTL, and other kas skip them meanwhile).
    clearing = asyncio.ensure_future(_clear_entries(services.state, max(grace_ends - time.monotonic(), READ_TIMEOUT_S)))
    await asyncio.gather(*stopping)
    # Calls of this kas' own proxies (the Kubernetes API proxy) forward through tunnels too: they get the grace.
    await asyncio.wait({agent_stopping}, timeout=max(grace_ends - time.monotonic(), 0.0))
    if ended := registry.end_tunnels():
        log.info("%d tunnels still forwarding at the end of the grace period ended", ended)
    await agent_stopping
    await clearing


async def _clear_entries(state: State, timeout_s: float) -> None:
    clears = asyncio.gather(
        state.tunnel_tracker.clear(), state.agent_tracker.clear(), state.instances.clear(), return_exceptions=True
    )
    try:
        await wait_or_abandon(clears, timeout_s)
    except TimeoutError:
        log.warning("Redis did not answer within %.1f s: this kas' entries stay until they expire", timeout_s)
