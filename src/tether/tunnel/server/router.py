"""The routing kas: the one place that decides where a request for an agent goes (seed 001, kas.md §2.5).

It tries itself first (in memory), then each gateway kas the tunnel tracker lists for the agent, moving
on when the last one tried answered ``NoTunnel`` or stayed silent for ``try_new_kas_interval``. Attempts
stay open concurrently; the first gateway to answer ``TunnelReady`` gets ``StartStreaming`` and every
other attempt is cancelled, so its gateway returns the reserved tunnel. While nothing is found, a
``TunnelsAvailable`` pub/sub event for the agent starts an attempt at once; a slow re-read of the
tracker covers lost events. Then frames are relayed both ways without being decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from google.rpc import status_pb2
from prometheus_client import Counter, Histogram

from tether.pb.gitlab.agent.kas import kasapp_pb2
from tether.tool import tracing
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.backoff import Backoff
from tether.tool.circuit_breaker import CircuitOpen
from tether.tool.grpc_meta import Metadata, MetadataIn, timeout_entry
from tether.tool.relay import AnswerFrames, Handler, dispatch, pump
from tether.tool.status import StatusError
from tether.tool.tasks import cancel_and_wait
from tether.tunnel.server.gateway import Gateway, LocalCaller
from tether.tunnel.server.gateway_call import GatewayCall, GatewayUnavailable, LocalGatewayCall, RemoteGatewayCall
from tether.tunnel.server.kas_pool import KasPool, KasUrlError
from tether.tunnel.server.metadata import ROUTING_AGENT_ID_KEY, forwardable
from tether.tunnel.server.notifier import TunnelNotifier

if TYPE_CHECKING:
    from tether.tool.tracing_sdk import Tracer

log = logging.getLogger(__name__)
NOT_FOUND_MESSAGE = "Agent connection not found. Is agent up to date and connected?"

ROUTING_DURATION = Histogram(
    "k8s_api_proxy_routing_duration_seconds",
    "Time to find a tunnel for a routed request",
    ["status"],
    buckets=[0.001 * 4**n for n in range(8)],
)
ROUTING_TIMEOUTS = Counter("k8s_api_proxy_routing_timeout_total", "Routed requests that found no tunnel in time")


class RoutingError(StatusError):
    """Routing failed; ``code``/``message`` are the status for the original caller."""


#: The original call being routed: raw request frames in, agentk's answer out (the gateway's own fast path takes
#: the same shape).
CallerSide = LocalCaller


class TunnelUrlSource(Protocol):
    """Which kas instances hold tunnels of an agent (the tunnel tracker, kas.md §3.2)."""

    async def kas_urls(self, agent_id: int) -> list[str]:
        """Private API URLs of the kas instances with tunnels of ``agent_id``.

        Raises:
            CircuitOpen: the tracker's store is stalled or failing (the router goes on without it).
        """


@dataclass(frozen=True)
class RoutingOptions:
    """Timings in seconds (upstream constants, kas.md §2.5).

    Attributes:
        find_timeout_s: how long a request without a deadline of its own waits for a tunnel.
        try_new_kas_interval_s: move on to the next gateway when the last one is silent this long.
        recheck_interval_s: re-read the tunnel tracker this often while waiting (safety net).
    """

    find_timeout_s: float = 20.0
    try_new_kas_interval_s: float = 0.01
    recheck_interval_s: float = 2.0


_Winner = tuple[GatewayCall, StreamAutomaton[kasapp_pb2.GatewayKasResponse]]


class Router:
    """Routes calls for agents to whichever kas holds a tunnel.

    Args:
        own_url: this kas' private API URL (its own attempts use memory, not the network).
        gateway: this kas' gateway, for the in-memory attempt.
        pool: connections to other kas instances.
        urls: the tunnel tracker.
        notifier: pub/sub wake-ups for waiting requests.
        options: timings.
    """

    def __init__(
        self,
        own_url: str,
        gateway: Gateway,
        pool: KasPool,
        urls: TunnelUrlSource,
        notifier: TunnelNotifier,
        options: RoutingOptions | None = None,
    ) -> None:
        self._own_url = own_url
        self._gateway = gateway
        self._pool = pool
        self._urls = urls
        self._notifier = notifier
        self._options = options or RoutingOptions()

    async def route(
        self,
        agent_id: int,
        full_method: str,
        metadata: MetadataIn | None,
        caller: CallerSide,
        timeout_s: float | None,
        find_timeout_s: float | None = None,
    ) -> status_pb2.Status | None:
        """Route one call to agent ``agent_id`` and relay it.

        Args:
            agent_id: destination agent.
            full_method: ``/package.Service/Method`` as agentk serves it.
            metadata: the caller's metadata (``kas-hop-*`` and ``authorization`` are not forwarded).
            caller: the original call.
            timeout_s: the caller's remaining deadline in seconds, or None (then ``find_timeout_s`` caps
                the wait for a tunnel). It bounds the whole call and travels to agentk (``tether-timeout-ms``).
            find_timeout_s: caps the wait for a tunnel instead of ``find_timeout_s`` of the options when
                ``timeout_s`` is None (a long call that must find its agent quickly).

        Returns:
            agentk's failure status, or None when the call succeeded.

        Raises:
            RoutingError: DEADLINE_EXCEEDED with :data:`NOT_FOUND_MESSAGE` when no tunnel was found in time,
                or when ``timeout_s`` expired during the call; UNAVAILABLE when the gateway or tunnel failed
                during the call.
        """
        tracer = tracing.TRACER
        if tracer is not None:
            return await self._route_traced(tracer, agent_id, full_method, metadata, caller, timeout_s, find_timeout_s)
        return await self._route(agent_id, full_method, metadata, caller, timeout_s, find_timeout_s)

    async def _route_traced(
        self,
        tracer: Tracer,
        agent_id: int,
        full_method: str,
        metadata: MetadataIn | None,
        caller: CallerSide,
        timeout_s: float | None,
        find_timeout_s: float | None,
    ) -> status_pb2.Status | None:
        """:meth:`route` as a client span (routing kas -> gateway kas), a child of the caller's trace context."""
        attributes: dict[str, str | int] = {"rpc.method": full_method, "tether.agent_id": agent_id}
        span = tracer.start(f"kas route {full_method}", "client", metadata or (), attributes)
        try:
            outgoing = tracing.with_trace(metadata or (), span.carrier())
            status = await self._route(agent_id, full_method, outgoing, caller, timeout_s, find_timeout_s)
            if status is not None:
                span.grpc_status(status.code, status.message)
            return status
        except RoutingError as exc:
            span.grpc_status(exc.code.value[0], exc.message)
            raise
        except asyncio.CancelledError:
            span.set("tether.caller_gone", True)  # the caller left (e.g. a client with its answer): no failure
            raise
        except BaseException as exc:
            span.fail(repr(exc))
            raise
        finally:
            span.end()

    async def _route(
        self,
        agent_id: int,
        full_method: str,
        metadata: MetadataIn | None,
        caller: CallerSide,
        timeout_s: float | None,
        find_timeout_s: float | None,
    ) -> status_pb2.Status | None:
        outgoing = (*forwardable(metadata), (ROUTING_AGENT_ID_KEY, str(agent_id)))
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Answer a little before the caller's own deadline, so it gets kas' explanation rather than a bare
        # "Deadline Exceeded" from its own gRPC library.
        default = self._options.find_timeout_s if find_timeout_s is None else find_timeout_s
        timeout = default if timeout_s is None else max(timeout_s - min(0.2, timeout_s * 0.1), 0)
        if timeout_s is not None:
            outgoing = (*outgoing, timeout_entry(timeout_s))  # agentk bounds its own call by it too
        handle = self._gateway.reserve_now(agent_id, full_method)
        if handle is not None:
            # The usual case: the agent has an idle tunnel on this kas. The call goes straight onto it, without the
            # gateway protocol between two tasks of this process (issue 28: small requests).
            ROUTING_DURATION.labels(status="success").observe(loop.time() - started)
            try:
                forward = self._gateway.forward_reserved(handle, full_method, outgoing, caller)
                return await self._within(started, timeout_s, forward)
            finally:
                handle.done()
        try:
            call, automaton = await self._find(agent_id, full_method, outgoing, timeout)
        except RoutingError:
            ROUTING_DURATION.labels(status="aborted").observe(loop.time() - started)
            ROUTING_TIMEOUTS.inc()
            raise
        except asyncio.CancelledError:
            ROUTING_DURATION.labels(status="aborted").observe(loop.time() - started)
            raise
        ROUTING_DURATION.labels(status="success").observe(loop.time() - started)
        return await self._within(started, timeout_s, self._relay(call, automaton, caller))

    @staticmethod
    async def _within(
        started: float, timeout_s: float | None, relay: Coroutine[Any, Any, status_pb2.Status | None]
    ) -> status_pb2.Status | None:
        """Run ``relay``; the caller's deadline bounds the whole call, not only the wait for a tunnel (issue 9)."""
        if timeout_s is None:
            return await relay
        try:
            async with asyncio.timeout_at(started + timeout_s):
                return await relay
        except TimeoutError:
            raise RoutingError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the request's {timeout_s:g} s timeout expired during the call"
            ) from None

    # ---- finding a gateway with a tunnel -----------------------------------------------------------

    async def _find(self, agent_id: int, full_method: str, metadata: Metadata, timeout_s: float) -> _Winner:
        loop = asyncio.get_running_loop()
        winner: asyncio.Future[_Winner] = loop.create_future()
        attempts: dict[str, asyncio.Task[None]] = {}
        untried: list[str] = []
        last_tried = ""
        advance = asyncio.Event()

        def consider(urls: list[str]) -> None:
            untried.extend(u for u in urls if u not in attempts and u not in untried)

        def on_no_tunnel(url: str) -> None:
            if url == last_tried:
                advance.set()

        def try_next() -> None:
            nonlocal last_tried
            last_tried = untried.pop(0)
            advance.clear()
            attempts[last_tried] = loop.create_task(
                self._attempt(agent_id, last_tried, full_method, metadata, winner, on_no_tunnel)
            )

        deadline = loop.time() + timeout_s
        lookup: asyncio.Task[list[str]] | None = None
        try:
            with self._notifier.watch(agent_id) as announced:
                consider([self._own_url])
                try_next()
                # The tracker is first read once this kas answered NoTunnel itself, or stayed silent for
                # try_new_kas_interval: a request whose agent has a tunnel here (the usual case) then costs no
                # Redis round trip (issue 28: an HSCAN per proxied request; routing's share of kas' samples went
                # from 4.0 to 1.4 %).
                lookup_at: float | None = loop.time() + self._options.try_new_kas_interval_s
                try_at = loop.time() + self._options.try_new_kas_interval_s
                recheck_at = loop.time() + self._options.recheck_interval_s
                while not winner.done():
                    now = loop.time()
                    if now >= deadline:
                        raise RoutingError(grpc.StatusCode.DEADLINE_EXCEEDED, NOT_FOUND_MESSAGE)
                    if lookup_at is not None and (advance.is_set() or now >= lookup_at):
                        lookup = loop.create_task(self._tracker_urls(agent_id))
                        lookup_at = None
                        recheck_at = now + self._options.recheck_interval_s
                    if lookup is not None and lookup.done():
                        consider(lookup.result())
                        lookup = None
                    if untried and (advance.is_set() or now >= try_at):
                        try_next()
                        try_at = now + self._options.try_new_kas_interval_s
                        continue
                    if lookup is None and lookup_at is None and now >= recheck_at:
                        lookup = loop.create_task(self._tracker_urls(agent_id))
                        recheck_at = now + self._options.recheck_interval_s
                    wake_at = min(deadline, recheck_at, try_at if untried else math.inf, lookup_at or math.inf)
                    # ``advance`` stays set after the last attempt's NoTunnel until another kas is tried: waiting
                    # on it with nothing left to try returned at once, and the loop spun (a waiting request
                    # held a core; issue 28, the wake-up regression).
                    moving_on = advance if untried or lookup_at is not None else None
                    await self._wait_any(winner, announced, moving_on, lookup, wake_at - now, consider)
            return winner.result()
        finally:
            if not winner.done():
                winner.cancel()
            # The attempts that lost (or all of them, on a timeout or cancellation) end before the call goes on:
            # each gives back the tunnel it may have reserved meanwhile.
            try:
                await cancel_and_wait(lookup, *attempts.values(), drop_errors=False)
            except asyncio.CancelledError:
                # Cancelled while the losers ended: the call that won is nobody's now, so it ends too (else
                # it would hold the agent's tunnel until its start timeout).
                if winner.done() and not winner.cancelled() and winner.exception() is None:
                    winner.result()[0].cancel()
                raise

    @staticmethod
    async def _wait_any(
        winner: asyncio.Future[_Winner],
        announced: asyncio.Queue[str],
        advance: asyncio.Event | None,
        lookup: asyncio.Task[list[str]] | None,
        timeout_s: float,
        consider: Callable[[list[str]], None],
    ) -> None:
        event = asyncio.ensure_future(announced.get())
        advanced = None if advance is None else asyncio.ensure_future(advance.wait())
        waiters: set[asyncio.Future[Any]] = {winner, event}
        if advanced is not None:
            waiters.add(advanced)
        if lookup is not None:
            waiters.add(lookup)
        try:
            await asyncio.wait(waiters, timeout=max(timeout_s, 0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(event, advanced)
        if not event.cancelled():
            consider([event.result()])
        while not announced.empty():
            consider([announced.get_nowait()])

    async def _tracker_urls(self, agent_id: int) -> list[str]:
        """The tracker's kas URLs for ``agent_id``; none while it fails (this kas and pub/sub events remain)."""
        try:
            return await self._urls.kas_urls(agent_id)
        except CircuitOpen:
            return []  # the breaker logged the stall once; each waiting request would repeat it
        except Exception:
            log.exception("reading the tunnel tracker failed", extra={"agent_id": agent_id})
            return []

    def _open(self, url: str, full_method: str, metadata: Metadata) -> GatewayCall:
        if url == self._own_url:
            return LocalGatewayCall(self._gateway, full_method, metadata)
        return RemoteGatewayCall(self._pool, url, full_method, metadata)

    async def _attempt(
        self,
        agent_id: int,
        url: str,
        full_method: str,
        metadata: Metadata,
        winner: asyncio.Future[_Winner],
        on_no_tunnel: Callable[[str], None],
    ) -> None:
        backoff = Backoff(initial_s=0.1, max_s=1.0, factor=2.0, jitter=1.0, reset_after_s=10.0)
        reported = False
        while not winner.done():
            try:
                call = self._open(url, full_method, metadata)
            except KasUrlError:
                log.warning("ignoring malformed kas URL %r from the tunnel tracker", url)
                return
            automaton = StreamAutomaton(kasapp_pb2.GatewayKasResponse)

            async def on_no_tunnel_frame(_response: kasapp_pb2.GatewayKasResponse) -> None:
                nonlocal reported
                if not reported:
                    reported = True
                    on_no_tunnel(url)

            async def on_tunnel_ready(
                _response: kasapp_pb2.GatewayKasResponse, call: GatewayCall = call, automaton: Any = automaton
            ) -> bool:
                if winner.done():
                    call.cancel()
                else:
                    winner.set_result((call, automaton))
                return True

            try:
                handlers: dict[str, Handler[kasapp_pb2.GatewayKasResponse]] = {
                    "no_tunnel": on_no_tunnel_frame,
                    "tunnel_ready": on_tunnel_ready,
                }
                if await dispatch(call.read, automaton, handlers):
                    return
                # A clean end (e.g. the gateway's max connection age): try again at once.
            except asyncio.CancelledError:
                call.cancel()
                raise
            except (GatewayUnavailable, StreamOrderError) as exc:
                call.cancel()
                log.info("gateway attempt to %s failed: %s", url, exc, extra={"agent_id": agent_id})
                if url != self._own_url and url not in await self._tracker_urls(agent_id):
                    return
                await asyncio.sleep(backoff.next_delay())

    # ---- relaying the call ------------------------------------------------------------------------

    async def _relay(
        self, call: GatewayCall, automaton: StreamAutomaton[kasapp_pb2.GatewayKasResponse], caller: CallerSide
    ) -> status_pb2.Status | None:
        requests: asyncio.Task[None] | None = None
        completed = False
        answer = AnswerFrames(caller.send_header, caller.write, caller.set_trailer)

        try:
            await call.write(kasapp_pb2.StartStreaming().SerializeToString())
            requests = asyncio.get_running_loop().create_task(self._pump_requests(call, caller))
            await dispatch(call.read, automaton, answer.handlers())
            completed = True
            return answer.error
        except GatewayUnavailable as exc:
            raise RoutingError(grpc.StatusCode.UNAVAILABLE, f"gateway kas failed: {exc.message}") from exc
        except StreamOrderError as exc:
            raise RoutingError(grpc.StatusCode.UNAVAILABLE, f"gateway kas broke the protocol: {exc}") from exc
        finally:
            if requests is not None and not requests.done():
                requests.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await requests
            if not completed:
                call.cancel()

    @staticmethod
    async def _pump_requests(call: GatewayCall, caller: CallerSide) -> None:
        # A GatewayUnavailable here means the gateway already ended the call; its outcome comes on the response side.
        with contextlib.suppress(GatewayUnavailable):
            await pump(caller.read, call.write, call.done_writing)
