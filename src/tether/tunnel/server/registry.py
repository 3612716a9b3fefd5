"""kas' tunnel registry: idle tunnels by agent id and the requests waiting for one (kas.md §1.6).

A tunnel serves one call and is then retired. ``find`` hands out an idle tunnel that advertises the
requested method, or waits until one registers. The tunnel tracker in Redis (or memory) learns that this
kas holds tunnels of an agent on the agent's first tunnel, and forgets it 5 s after the agent's last idle
tunnel is gone unless a new one arrives first (agentk reconnects at once after each call).

On SIGTERM, before it stops, kas *drains* the registry (:meth:`TunnelRegistry.drain`): agents move to another
kas make-before-break. kas has stopped accepting new connections on its agent listener, so a tunnel agentk
opens now lands on another kas (through the load balancer); ending one idle tunnel of an agent with OK makes
agentk open its replacement at once (Tether's agentk and upstream's alike, kas.md §1.4 step 4). Meanwhile the
agent's other idle tunnels here keep serving. When the agent has tunnels on another kas (that kas'
``TunnelsAvailable`` announcement, or the tunnel tracker), its remaining idle tunnels end, this kas' tracker
entry for it goes at once, and the requests waiting here for it fail over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.tunnel.server.tunnel import ConnectContext, Tunnel, TunnelState

log = logging.getLogger(__name__)
UNREGISTRATION_DELAY_S = 5.0


class TunnelTrackerLike(Protocol):
    """Where kas records that it holds tunnels of an agent (kas.md §3.2)."""

    async def register(self, agent_id: int) -> None:
        """Record this kas as holding tunnels of ``agent_id``."""

    async def unregister(self, agent_id: int) -> None:
        """Forget that this kas holds tunnels of ``agent_id``."""


class RegistryStopped(Exception):
    """The registry is shutting down; waiting callers get UNAVAILABLE "kas is shutting down"."""


@dataclass(eq=False)
class _Waiter:
    agent_id: int
    service: str
    method: str
    future: asyncio.Future[Tunnel] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class FindHandle:
    """A request for a tunnel of one agent that serves ``service``/``method``.

    Attributes:
        found_now: True when an idle tunnel was available at once (the gateway then skips ``NoTunnel``).
    """

    def __init__(self, registry: TunnelRegistry, waiter: _Waiter, found_now: bool) -> None:
        self._registry = registry
        self._waiter = waiter
        self.found_now = found_now
        self._used = False

    async def get(self) -> Tunnel:
        """Wait for the tunnel; cancel the awaiting task (or use a timeout around it) to give up.

        Raises:
            RegistryStopped: the registry stopped while waiting.
        """
        return await asyncio.shield(self._waiter.future)

    def use(self) -> Tunnel:
        """Claim the delivered tunnel for forwarding; it will not return to the registry."""
        self._used = True
        return self._waiter.future.result()

    def done(self) -> None:
        """Release the request: stop waiting, and give back a delivered tunnel that was not used."""
        self._registry._release(self._waiter, self._used)


class TunnelRegistry:
    """Idle tunnels and waiting find requests of every agent connected to this kas.

    Args:
        tracker: receives (un)registrations of this kas for an agent; None for none.
        unregistration_delay_s: grace before forgetting an agent whose last idle tunnel is gone.
    """

    def __init__(
        self, tracker: TunnelTrackerLike | None, unregistration_delay_s: float = UNREGISTRATION_DELAY_S
    ) -> None:
        self._tracker = tracker
        self._delay_s = unregistration_delay_s
        self._idle: dict[int, list[Tunnel]] = {}
        self._waiters: dict[int, list[_Waiter]] = {}
        self._tracked: set[int] = set()
        #: Agents with tunnels here whose tracker registration failed (Redis away); :meth:`register_failed` retries.
        self._unadvertised: set[int] = set()
        self._unregister_timers: dict[int, asyncio.TimerHandle] = {}
        #: Tunnels to retire when idle at the loop time (whole seconds) they are keyed by.
        self._aging: dict[int, set[Tunnel]] = {}
        #: Tunnels whose age passed while they were forwarding (a long watch): they end with their call.
        self._overdue: set[Tunnel] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._stopped = False
        #: Set while draining (:meth:`drain`): agents move to another kas.
        self._draining = False
        #: Agents known to have tunnels on another kas while draining.
        self._moved: set[int] = set()
        self._all_moved = asyncio.Event()
        #: Called with (agent_id) whenever a tunnel of that agent becomes idle here; used for metrics/tests.
        self.on_tunnel: Callable[[int], None] | None = None

    # ---- tunnels (called by the Connect handler) -------------------------------------------------

    async def accept_tunnel(
        self,
        agent_id: int,
        descriptor: info_pb2.AgentDescriptor,
        context: ConnectContext,
        connection_id: int | None,
        max_age_s: float,
    ) -> tuple[grpc.StatusCode, str] | None:
        """:meth:`handle_tunnel` for a new tunnel of ``agent_id`` on ``context`` (``modserver.api.TunnelHandler``)."""
        tunnel = Tunnel(agent_id, descriptor, context, connection_id)
        del descriptor  # the tunnel keeps only its methods; this frame lives as long as the tunnel
        return await self.handle_tunnel(tunnel, max_age_s)

    async def handle_tunnel(self, tunnel: Tunnel, max_age_s: float) -> tuple[grpc.StatusCode, str] | None:
        """Register ``tunnel`` and block until it is finished; return the status its Connect RPC ends with.

        The tunnel is dropped at once when the Connect RPC is cancelled (agentk disconnected). When
        ``max_age_s`` passes (rounded up to the next whole second of the loop clock) while it is idle it is
        retired with OK so agentk reconnects on a fresh connection; a tunnel already forwarding is waited for.
        """
        if self._stopped:
            return (grpc.StatusCode.UNAVAILABLE, "kas is shutting down")
        if self._draining:
            # A tunnel that raced the listener's stop: OK makes agentk open it again at once, on another kas; an
            # error would make it back off first (kas.md §1.4 step 4).
            return None
        self._add(tunnel)
        bucket = self._age_out_later(tunnel, max_age_s)
        try:
            # No shield: nothing else awaits ``finished``, and whoever resolves it checks ``done()`` first;
            # a shield's future and callbacks per tunnel added up at 10,000 agents (issue 9).
            return await tunnel.finished
        finally:
            aging = self._aging.get(bucket)
            if aging is not None:
                aging.discard(tunnel)
            self._overdue.discard(tunnel)
            self._retire_if_idle(tunnel)  # cancelled while idle: agentk went away

    def _age_out_later(self, tunnel: Tunnel, max_age_s: float) -> int:
        # Aged out, an idle tunnel ends OK so agentk reconnects on a fresh connection; one forwarding finishes.
        # Tunnels due in the same second share one timer: a timer per tunnel (two idle ones per agent, for
        # hours) cost about 700 bytes each at 10,000 agents (issue 9).
        loop = asyncio.get_running_loop()
        bucket = math.ceil(loop.time() + max_age_s)
        tunnels = self._aging.get(bucket)
        if tunnels is None:
            tunnels = self._aging[bucket] = set()
            loop.call_at(bucket, self._age_out, bucket)
        tunnels.add(tunnel)
        return bucket

    def _age_out(self, bucket: int) -> None:
        for tunnel in self._aging.pop(bucket, ()):
            if tunnel.state is not TunnelState.READY:
                self._overdue.add(tunnel)  # forwarding: it ends with its call, and end_tunnels still finds it
            self._retire_if_idle(tunnel)

    def _retire_if_idle(self, tunnel: Tunnel) -> None:
        if tunnel.state is TunnelState.READY:
            self._remove_idle(tunnel)
            tunnel.retire()

    def _add(self, tunnel: Tunnel) -> None:
        tunnel.state = TunnelState.READY
        for waiter in self._waiters.get(tunnel.agent_id, []):
            if tunnel.supports(waiter.service, waiter.method) and not waiter.future.done():
                self._waiters[tunnel.agent_id].remove(waiter)
                tunnel.state = TunnelState.FOUND
                waiter.future.set_result(tunnel)
                return
        self._idle.setdefault(tunnel.agent_id, []).append(tunnel)
        self._cancel_unregistration(tunnel.agent_id)
        if tunnel.agent_id not in self._tracked:
            self._tracked.add(tunnel.agent_id)
            self._spawn(self._io("register", tunnel.agent_id))
        if self.on_tunnel is not None:
            self.on_tunnel(tunnel.agent_id)

    def _remove_idle(self, tunnel: Tunnel) -> None:
        tunnels = self._idle.get(tunnel.agent_id)
        if tunnels is None or tunnel not in tunnels:
            return
        tunnels.remove(tunnel)
        if not tunnels:
            del self._idle[tunnel.agent_id]
            self._schedule_unregistration(tunnel.agent_id)
            self._check_all_moved()

    # ---- find (called by the gateway) --------------------------------------------------------------

    def find(self, agent_id: int, service: str, method: str) -> FindHandle:
        """Reserve an idle tunnel of ``agent_id`` serving ``service``/``method``, or queue a wait for one.

        Raises:
            RegistryStopped: the registry is shutting down.
        """
        if self._stopped or agent_id in self._moved:
            raise RegistryStopped("kas is shutting down")
        waiter = _Waiter(agent_id, service, method)
        # Newest first: agentk may close its oldest extra idle tunnels, so those are the riskiest to hand out.
        for tunnel in reversed(self._idle.get(agent_id, [])):
            if tunnel.supports(service, method):
                self._remove_idle(tunnel)
                tunnel.state = TunnelState.FOUND
                waiter.future.set_result(tunnel)
                return FindHandle(self, waiter, found_now=True)
        self._waiters.setdefault(agent_id, []).append(waiter)
        return FindHandle(self, waiter, found_now=False)

    def _release(self, waiter: _Waiter, used: bool) -> None:
        waiters = self._waiters.get(waiter.agent_id)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[waiter.agent_id]
        if not waiter.future.done():
            waiter.future.cancel()
        elif not waiter.future.cancelled() and waiter.future.exception() is None and not used:
            tunnel = waiter.future.result()
            if tunnel.state is TunnelState.FOUND and not self._stopped and tunnel.agent_id not in self._moved:
                self._add(tunnel)  # not used: back to the registry for the next caller
            elif tunnel.state is TunnelState.FOUND:
                tunnel.retire()

    # ---- Redis bookkeeping -------------------------------------------------------------------------

    def _schedule_unregistration(self, agent_id: int) -> None:
        if agent_id not in self._tracked or agent_id in self._unregister_timers:
            return
        loop = asyncio.get_running_loop()
        self._unregister_timers[agent_id] = loop.call_later(self._delay_s, self._unregister_now, agent_id)

    def _cancel_unregistration(self, agent_id: int) -> None:
        timer = self._unregister_timers.pop(agent_id, None)
        if timer is not None:
            timer.cancel()

    def _unregister_now(self, agent_id: int) -> None:
        self._unregister_timers.pop(agent_id, None)
        if agent_id in self._idle or agent_id not in self._tracked:
            return
        self._tracked.discard(agent_id)
        self._spawn(self._io("unregister", agent_id))

    async def _io(self, action: str, agent_id: int) -> None:
        if self._tracker is None:
            return
        try:
            await getattr(self._tracker, action)(agent_id)
        except Exception:
            # The tracker already retried. A registration that failed is forgotten (nothing half-registered is
            # refreshed forever) and retried by register_failed() or the agent's next tunnel; an unregistration
            # expires.
            log.exception("tunnel tracker %s failed", action, extra={"agent_id": agent_id})
            if action == "register":
                self._tracked.discard(agent_id)
                self._unadvertised.add(agent_id)
        else:
            self._unadvertised.discard(agent_id)

    async def register_failed(self) -> list[int]:
        """Register again every agent whose registration failed and that still has idle tunnels here.

        Without this such an agent stays unreachable from other kas instances until a new tunnel of it
        arrives, which never happens while nobody can route to it (issue 9 chaos test: Redis outage).
        Returns the agent ids registered now; failures stay pending for the next call.
        """
        pending, self._unadvertised = self._unadvertised, set()
        registered = []
        for agent_id in sorted(pending):
            if agent_id not in self._idle or agent_id in self._tracked:
                continue
            self._tracked.add(agent_id)
            await self._io("register", agent_id)
            if agent_id in self._tracked:
                registered.append(agent_id)
        return registered

    async def run(self, retry_s: float = 2.0) -> None:
        """Retry failed registrations every ``retry_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(retry_s)
            if self._unadvertised:
                await self.register_failed()

    def _spawn(self, coro: object) -> None:
        # Redis I/O must not be lost when the request that triggered it is cancelled (kas.md §1.6).
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- introspection and shutdown ----------------------------------------------------------------

    def idle_count(self, agent_id: int | None = None) -> int:
        """Number of idle tunnels (of one agent, or of all)."""
        if agent_id is not None:
            return len(self._idle.get(agent_id, []))
        return sum(len(t) for t in self._idle.values())

    def waiting_count(self) -> int:
        """Number of find requests waiting for a tunnel."""
        return sum(len(w) for w in self._waiters.values())

    async def drain(self, elsewhere: Callable[[int], Awaitable[bool]], timeout_s: float) -> int:
        """Move the agents with idle tunnels here to other kas instances, make-before-break (module docstring).

        Args:
            elsewhere: whether an agent already has tunnels on another kas (the tunnel tracker); errors count as no.
            timeout_s: give up waiting for the agents that have not moved this many seconds after the call
                (``elsewhere``'s reads included).

        Returns:
            the number of agents that had not moved when the wait ended (their tunnels end at :meth:`stop`).
        """
        self._draining = True
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + timeout_s
        agents = list(self._idle)
        results = await asyncio.gather(*(elsewhere(a) for a in agents), return_exceptions=True)
        for agent_id, moved in zip(agents, results, strict=True):
            if moved is True:
                self.moved(agent_id)
            elif tunnels := self._idle.get(agent_id):
                # One tunnel ends now: agentk opens its replacement on another kas; the others keep serving.
                tunnel = tunnels[0]
                self._remove_idle(tunnel)
                tunnel.retire()
        self._check_all_moved()
        log.info(
            "draining: %d agents with idle tunnels here, %d of them already on another kas",
            len(agents),
            sum(moved is True for moved in results),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_moved.wait(), max(give_up_at - loop.time(), 0.0))
        return len(self._idle)

    def moved(self, agent_id: int) -> None:
        """While draining: ``agent_id`` has tunnels on another kas, so its tunnels and entry here go now.

        Called for every ``TunnelsAvailable`` announcement of another kas; does nothing unless draining.
        """
        if not self._draining or self._stopped:
            return
        self._moved.add(agent_id)
        for tunnel in self._idle.pop(agent_id, []):
            tunnel.retire()
        for waiter in self._waiters.pop(agent_id, []):
            if not waiter.future.done():
                # The routing kas moves on to the kas that announced the agent.
                waiter.future.set_exception(RegistryStopped("kas is shutting down; the agent moved"))
        self._cancel_unregistration(agent_id)
        if agent_id in self._tracked:
            self._tracked.discard(agent_id)
            self._spawn(self._io("unregister", agent_id))
        self._check_all_moved()

    def _check_all_moved(self) -> None:
        if self._draining and not self._idle:
            self._all_moved.set()

    def tracked_agents(self) -> set[int]:
        """Agents this kas has registered in the tunnel tracker."""
        return set(self._tracked)

    async def stop(self) -> None:
        """Shut down (kas.md §1.6 Stop): fail waiters, retire idle tunnels with OK, flush pending I/O."""
        self._stopped = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(RegistryStopped("kas is shutting down"))
        self._waiters.clear()
        for tunnels in self._idle.values():
            for tunnel in tunnels:
                tunnel.retire()
        self._idle.clear()
        for timer in self._unregister_timers.values():
            timer.cancel()
        self._unregister_timers.clear()
        if self._background:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._background), timeout=5.0)

    def end_tunnels(self) -> int:
        """End every tunnel still open here with OK, those forwarding a call included; return how many were open.

        The drain's last step before the agent listener's own grace ends (``kas/shutdown.py``). A tunnel gRPC
        cancels then ends with UNAVAILABLE "Cancelling all calls", and agentk backs off after a failed tunnel
        before it opens the next one; after OK it reconnects at once, to another kas (kas.md §1.4 step 4). The
        call a tunnel was forwarding fails for its caller as a broken tunnel (a watch ends with its terminating
        chunk at the routing kas).
        """
        open_tunnels = [t for bucket in self._aging.values() for t in bucket if not t.finished.done()]
        open_tunnels += [t for t in self._overdue if not t.finished.done()]
        for tunnel in open_tunnels:
            tunnel.retire()
        return len(open_tunnels)
