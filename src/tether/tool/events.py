"""Event bus between kas instances over the backend's pub/sub.

Seed 000: "For both events kas publishes a notification to a pub-sub channel"; kas.md §3.5.

Channel: ``f"{key_prefix}:kas_events"`` (default ``gitlab-kas:kas_events``). Upstream uses a bare ``kas_events``
(kas.md §3.5); Tether prefixes it like every key so several deployments can share one Redis. Payload: a serialized
``google.protobuf.Any`` (type preserved), e.g. ``gitlab.agent.event.AgentConnected``, ``AgentDisconnected``,
``TunnelsAvailable``, ``GitPushEvent``.

Every event goes through the backend, the publisher's own included, so all kas instances see one stream.

Usage::

    bus = EventBus(backend)
    task = asyncio.create_task(bus.run())          # one subscription per process
    await bus.wait_subscribed()                     # optional: from now on events are seen
    unsubscribe = bus.on(GitPushEvent, poke_poller) # callback per event (must not block)

    # "wait until agent 7 has tunnels somewhere or 20 s pass", without missing an event that arrives while
    # Redis is being queried: open the listener BEFORE the query.
    with bus.listen(TunnelsAvailable, lambda e: e.agent_id == 7) as tunnels:
        if not await tunnel_tracker.kas_urls(7):
            event = await tunnels.get(timeout_s=20)  # TimeoutError when nothing arrives
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Self, TypeVar

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from tether.tool.expiring_hash import DEFAULT_KEY_PREFIX, HashBackend, Publication

_log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


def events_channel(key_prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """Return the pub/sub channel name for ``key_prefix``: ``<prefix>:kas_events``."""
    return f"{key_prefix}:kas_events"


@dataclass(eq=False)
class _Handler:
    message_type: type[Message]
    deliver: Callable[[Message], None]


class Listener(Generic[M]):
    """A queue of the events of one type matching a predicate, collected while the listener is open.

    Obtain it from :meth:`EventBus.listen`; use it as a context manager (closing unregisters it) and read with
    :meth:`get` or ``async for``.
    """

    def __init__(self, bus: EventBus, message_type: type[M], predicate: Callable[[M], bool] | None) -> None:
        self._queue: asyncio.Queue[M] = asyncio.Queue()
        self._predicate = predicate
        self._unsubscribe = bus.on(message_type, self._offer)

    def _offer(self, message: M) -> None:
        if self._predicate is None or self._predicate(message):
            self._queue.put_nowait(message)

    async def get(self, timeout_s: float | None = None) -> M:
        """Return the next matching event, waiting up to ``timeout_s`` seconds (None: forever).

        Raises:
            TimeoutError: nothing arrived in time.
        """
        async with asyncio.timeout(timeout_s):
            return await self._queue.get()

    def close(self) -> None:
        """Stop collecting events (idempotent)."""
        self._unsubscribe()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> M:
        return await self.get()


class EventBus:
    """Publish protobuf events to every kas and dispatch received ones to in-process listeners.

    Args:
        backend: the pub/sub carrier (Redis or memory).
        key_prefix: kascfg ``redis.key_prefix``; the channel is ``<key_prefix>:kas_events``.

    :meth:`run` holds the single subscription of the process; without it nothing is dispatched. Unknown event
    types and undecodable payloads are logged and dropped; a failing callback is logged and does not stop the bus.
    """

    def __init__(self, backend: HashBackend, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self._backend = backend
        self._channel = events_channel(key_prefix)
        self._handlers: dict[str, list[_Handler]] = {}
        self._subscriptions = 0
        self._subscribed = asyncio.Event()

    @property
    def channel(self) -> str:
        """The pub/sub channel name."""
        return self._channel

    @property
    def subscriptions(self) -> int:
        """How many times the subscription was confirmed (1 after start; +1 per re-subscription)."""
        return self._subscriptions

    async def publish(self, message: Message) -> None:
        """Publish ``message`` wrapped in ``google.protobuf.Any`` (kas.md §3.5).

        Raises:
            the backend's error; events are best-effort notifications, callers usually log and go on.
        """
        await self._backend.publish(*self.publication(message))

    def publication(self, message: Message) -> Publication:
        """``(channel, payload)`` of ``message`` for a write that publishes it in its own transaction.

        :meth:`HashBackend.set_fields`'s ``announce``: the event goes out with the write it announces.
        """
        wrapped = any_pb2.Any()
        wrapped.Pack(message)
        return self._channel, wrapped.SerializeToString()

    def on(self, message_type: type[M], callback: Callable[[M], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every received event of ``message_type``; returns the unregister function.

        The callback runs inside the dispatch loop: it must not block (schedule a task for slow work).
        """

        def deliver(message: Message) -> None:
            if isinstance(message, message_type):  # always true: decoded with message_type; narrows for mypy
                callback(message)

        handler = _Handler(message_type, deliver)
        name = message_type.DESCRIPTOR.full_name
        self._handlers.setdefault(name, []).append(handler)

        def unregister() -> None:
            handlers = self._handlers.get(name, [])
            if handler in handlers:
                handlers.remove(handler)

        return unregister

    def listen(self, message_type: type[M], predicate: Callable[[M], bool] | None = None) -> Listener[M]:
        """Start collecting events of ``message_type`` for which ``predicate`` (None: all) is true."""
        return Listener(self, message_type, predicate)

    async def wait_for(
        self, message_type: type[M], predicate: Callable[[M], bool] | None = None, timeout_s: float | None = None
    ) -> M:
        """Return the first matching event received from now on, waiting up to ``timeout_s`` seconds.

        Raises:
            TimeoutError: nothing matched in time.
        """
        with self.listen(message_type, predicate) as listener:
            return await listener.get(timeout_s)

    async def wait_subscribed(self, count: int = 1) -> None:
        """Wait until :attr:`subscriptions` reaches ``count`` (wrap in ``asyncio.timeout`` to bound it)."""
        while self._subscriptions < count:
            await self._subscribed.wait()

    def _on_subscribed(self) -> None:
        self._subscriptions += 1
        # Wake current waiters, then arm a fresh event for the next (re-)subscription.
        self._subscribed.set()
        self._subscribed = asyncio.Event()

    async def run(self) -> None:
        """Receive events until cancelled or the backend is closed, dispatching them to listeners."""
        async for payload in self._backend.subscribe(self._channel, on_subscribed=self._on_subscribed):
            self._dispatch(payload)

    def _dispatch(self, payload: bytes) -> None:
        try:
            wrapped = any_pb2.Any.FromString(payload)
        except DecodeError:
            _log.warning("undecodable event on %s (%d bytes); dropped", self._channel, len(payload))
            return
        name = wrapped.TypeName()
        handlers = self._handlers.get(name)
        if not handlers:
            _log.debug("no listener for event %s", name)
            return
        decoded: Message | None = None
        for handler in list(handlers):
            if decoded is None:
                try:
                    decoded = handler.message_type.FromString(wrapped.value)
                except DecodeError:
                    _log.warning("undecodable %s event on %s; dropped", name, self._channel)
                    return
            try:
                handler.deliver(decoded)
            except Exception:
                _log.exception("listener of %s failed", name)
