"""Tunnel registry rules (kas.md §1.6), with a recording tracker and tunnels that are never forwarded."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.tunnel.server.registry import RegistryStopped, TunnelRegistry
from tether.tunnel.server.tunnel import Tunnel, TunnelState

SERVICE, METHOD = "gitlab.agent.pods.rpc.Pods", "GetPods"


class RecordingTracker:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def register(self, agent_id: int) -> None:
        self.calls.append(("register", agent_id))

    async def unregister(self, agent_id: int) -> None:
        self.calls.append(("unregister", agent_id))


def tunnel(agent_id: int, methods: tuple[tuple[str, str], ...] = ((SERVICE, METHOD),)) -> Tunnel:
    services: dict[str, list[str]] = {}
    for service, method in methods:
        services.setdefault(service, []).append(method)
    descriptor = info_pb2.AgentDescriptor(
        services=[info_pb2.Service(name=s, methods=[info_pb2.Method(name=m) for m in ms]) for s, ms in services.items()]
    )
    context: Any = None  # never read or written: these tunnels are not forwarded
    return Tunnel(agent_id, descriptor, context)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_find_returns_idle_tunnel_at_once_and_takes_it_out() -> None:
    registry = TunnelRegistry(None)
    t = tunnel(1)
    holder = asyncio.create_task(registry.handle_tunnel(t, max_age_s=60))
    await settle()
    handle = registry.find(1, SERVICE, METHOD)
    assert handle.found_now
    assert await handle.get() is t and t.state is TunnelState.FOUND
    assert registry.idle_count() == 0
    assert handle.use() is t
    handle.done()
    assert registry.idle_count() == 0  # used tunnels never come back
    t.retire()
    assert await holder is None


async def test_find_waits_until_a_tunnel_with_the_method_registers() -> None:
    registry = TunnelRegistry(None)
    handle = registry.find(7, SERVICE, METHOD)
    assert not handle.found_now and registry.waiting_count() == 1
    waiting = asyncio.create_task(handle.get())
    other = tunnel(7, (("other.Service", "Call"),))
    holders = [asyncio.create_task(registry.handle_tunnel(other, 60))]
    await settle()
    assert not waiting.done(), "a tunnel without the method must not satisfy the request"
    right = tunnel(7)
    holders.append(asyncio.create_task(registry.handle_tunnel(right, 60)))
    assert await asyncio.wait_for(waiting, 1) is right
    assert registry.waiting_count() == 0 and registry.idle_count() == 1
    handle.done()
    for h in holders:
        h.cancel()
    await asyncio.gather(*holders, return_exceptions=True)


async def test_unused_tunnel_goes_back_to_the_registry() -> None:
    registry = TunnelRegistry(None)
    t = tunnel(3)
    holder = asyncio.create_task(registry.handle_tunnel(t, 60))
    await settle()
    handle = registry.find(3, SERVICE, METHOD)
    await handle.get()
    handle.done()  # the routing kas chose another gateway
    assert t.state is TunnelState.READY and registry.idle_count(3) == 1
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


async def test_cancelled_wait_leaves_nothing_behind() -> None:
    registry = TunnelRegistry(None)
    handle = registry.find(4, SERVICE, METHOD)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(handle.get(), 0.05)
    handle.done()
    assert registry.waiting_count() == 0
    t = tunnel(4)
    holder = asyncio.create_task(registry.handle_tunnel(t, 60))
    await settle()
    assert registry.idle_count(4) == 1, "the tunnel must not go to an abandoned request"
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


async def test_disconnected_agent_drops_idle_tunnel_at_once() -> None:
    registry = TunnelRegistry(None)
    t = tunnel(5)
    holder = asyncio.create_task(registry.handle_tunnel(t, 60))
    await settle()
    assert registry.idle_count(5) == 1
    holder.cancel()  # grpc.aio cancels the Connect handler when agentk goes away
    await asyncio.gather(holder, return_exceptions=True)
    assert registry.idle_count(5) == 0 and t.state is TunnelState.DONE


async def test_max_age_retires_an_idle_tunnel_with_ok() -> None:
    registry = TunnelRegistry(None)
    t = tunnel(6)
    assert await asyncio.wait_for(registry.handle_tunnel(t, max_age_s=0.05), 3) is None
    assert registry.idle_count() == 0 and t.state is TunnelState.DONE


async def test_tunnels_due_together_age_out_together_and_a_gone_one_is_forgotten() -> None:
    """Tunnels due in the same second share one timer (issue 9: a timer per idle tunnel cost memory at 10,000
    agents); every idle one still ends OK, and one whose agent left first is not retired again."""
    registry = TunnelRegistry(None)
    tunnels = [tunnel(100 + n) for n in range(50)]
    holders = [asyncio.create_task(registry.handle_tunnel(t, max_age_s=0.05)) for t in tunnels]
    await settle()
    holders[0].cancel()  # agentk went away
    results = await asyncio.wait_for(asyncio.gather(*holders, return_exceptions=True), 3)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [None] * 49
    assert registry.idle_count() == 0 and all(t.state is TunnelState.DONE for t in tunnels)


async def test_stop_fails_waiters_and_retires_idle_tunnels() -> None:
    registry = TunnelRegistry(None)
    t = tunnel(8)
    holder = asyncio.create_task(registry.handle_tunnel(t, 60))
    waiter = registry.find(9, SERVICE, METHOD)
    await settle()
    await registry.stop()
    with pytest.raises(RegistryStopped):
        await waiter.get()
    assert await holder is None, "idle tunnels end with OK so agents reconnect elsewhere"
    with pytest.raises(RegistryStopped):
        registry.find(8, SERVICE, METHOD)
    late = await registry.handle_tunnel(tunnel(8), 60)
    assert late is not None and late[0] is grpc.StatusCode.UNAVAILABLE


async def test_end_tunnels_ends_the_tunnels_still_forwarding_with_ok() -> None:
    """At the end of the drain's grace, tunnels carrying a call end with OK, those past their age included; left
    to the agent listener's own stop, gRPC ended them with UNAVAILABLE and agentk backed off (kas/shutdown.py)."""
    registry = TunnelRegistry(None)
    young, overdue = tunnel(10), tunnel(11)
    holders = [
        asyncio.create_task(registry.handle_tunnel(young, max_age_s=60)),
        asyncio.create_task(registry.handle_tunnel(overdue, max_age_s=0.05)),
    ]
    await settle()
    for agent_id in (10, 11):
        handle = registry.find(agent_id, SERVICE, METHOD)
        handle.use().state = TunnelState.FORWARDING  # as Tunnel.forward does
        handle.done()
    await asyncio.sleep(1.1)  # the overdue tunnel's age passes while it forwards: it is waited for
    assert not holders[1].done()
    await registry.stop()
    assert not any(h.done() for h in holders), "stop retires idle tunnels only"
    assert registry.end_tunnels() == 2
    assert await asyncio.wait_for(asyncio.gather(*holders), 1) == [None, None]
    assert registry.end_tunnels() == 0


async def test_tracker_registration_once_and_delayed_unregistration() -> None:
    tracker = RecordingTracker()
    registry = TunnelRegistry(tracker, unregistration_delay_s=0.1)
    first, second = tunnel(11), tunnel(11)
    holders = [asyncio.create_task(registry.handle_tunnel(t, 60)) for t in (first, second)]
    await settle()
    assert tracker.calls == [("register", 11)]
    holders[0].cancel()
    holders[1].cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    await asyncio.sleep(0.05)
    replacement = asyncio.create_task(registry.handle_tunnel(tunnel(11), 60))
    await asyncio.sleep(0.2)
    assert tracker.calls == [("register", 11)], "a tunnel within the delay cancels the unregistration"
    replacement.cancel()
    await asyncio.gather(replacement, return_exceptions=True)
    await asyncio.sleep(0.2)
    assert tracker.calls == [("register", 11), ("unregister", 11)]


class FailingTracker(RecordingTracker):
    """Fails every registration while ``down`` (Redis away), like the tracker after its own retries."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def register(self, agent_id: int) -> None:
        if self.down:
            raise ConnectionError("Redis is away")
        await super().register(agent_id)


async def test_failed_registration_is_retried_while_the_agent_keeps_its_idle_tunnels() -> None:
    # Issue 9 chaos test: an agent whose registration failed during a Redis outage was advertised again only
    # when a new tunnel of it arrived, which never happens while no other kas can route to it.
    tracker = FailingTracker()
    registry = TunnelRegistry(tracker)
    holder = asyncio.create_task(registry.handle_tunnel(tunnel(21), 60))
    gone = asyncio.create_task(registry.handle_tunnel(tunnel(22), 60))
    await settle()
    assert registry.tracked_agents() == set()
    assert await registry.register_failed() == [], "still failing: nothing registered, still pending"
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    tracker.down = False
    assert await registry.register_failed() == [21], "agent 22 has no tunnel here any more"
    assert tracker.calls == [("register", 21)] and registry.tracked_agents() == {21}
    assert await registry.register_failed() == []
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


async def test_tunnels_with_equal_descriptors_share_one_method_set() -> None:
    first, second = tunnel(1), tunnel(2)
    assert first.methods is second.methods
    assert first.supports(SERVICE, METHOD) and second.supports(SERVICE, METHOD)
    other = tunnel(3, ((SERVICE, METHOD), ("gitlab.agent.graph.rpc.Graph", "Watch")))
    assert other.methods is not first.methods and other.supports("gitlab.agent.graph.rpc.Graph", "Watch")
    assert not first.supports("gitlab.agent.graph.rpc.Graph", "Watch")


async def test_drain_moves_each_agent_make_before_break() -> None:
    """One idle tunnel per agent ends at once; the rest serve until the agent has tunnels on another kas."""
    tracker = RecordingTracker()
    registry = TunnelRegistry(tracker)
    a1, a2, b1 = tunnel(1), tunnel(1), tunnel(2)
    holders = [asyncio.create_task(registry.handle_tunnel(t, 60)) for t in (a1, a2, b1)]
    await settle()
    elsewhere = {1: False, 2: True}  # agent 2 already has tunnels on another kas

    async def has_tunnels_elsewhere(agent_id: int) -> bool:
        return elsewhere[agent_id]

    draining = asyncio.create_task(registry.drain(has_tunnels_elsewhere, timeout_s=10))
    await settle()
    assert a1.finished.done() and a1.finished.result() is None, "one of agent 1's tunnels ends with OK at once"
    assert not a2.finished.done(), "agent 1 keeps a tunnel here until it has moved"
    assert b1.finished.done(), "agent 2 is elsewhere already: its tunnels end now"
    assert ("unregister", 2) in tracker.calls
    # A tunnel arriving while draining (it raced the listener's stop) ends with OK: agentk opens it again at once.
    assert await registry.handle_tunnel(tunnel(1), 60) is None
    handle = registry.find(1, SERVICE, METHOD)
    assert handle.found_now and await handle.get() is a2, "the remaining tunnel still serves"
    handle.done()  # unused: back to the registry
    assert not draining.done()
    registry.moved(1)  # another kas announced agent 1's tunnels
    assert await asyncio.wait_for(draining, 1) == 0
    assert a2.finished.done() and ("unregister", 1) in tracker.calls
    with pytest.raises(RegistryStopped):
        registry.find(1, SERVICE, METHOD)
    await asyncio.gather(*holders)


async def test_drain_gives_up_on_agents_that_do_not_move() -> None:
    registry = TunnelRegistry(None)
    a1, a2 = tunnel(1), tunnel(1)
    holders = [asyncio.create_task(registry.handle_tunnel(t, 60)) for t in (a1, a2)]
    await settle()

    async def nowhere(_agent_id: int) -> bool:
        raise ConnectionError("Redis away")

    assert await registry.drain(nowhere, timeout_s=0.05) == 1
    await registry.stop()
    await asyncio.gather(*holders)
    assert a2.finished.result() is None


async def test_moved_does_nothing_unless_draining() -> None:
    registry = TunnelRegistry(None)
    t = tunnel(1)
    holder = asyncio.create_task(registry.handle_tunnel(t, 60))
    await settle()
    registry.moved(1)
    assert registry.idle_count(1) == 1 and not t.finished.done()
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
