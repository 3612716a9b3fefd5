"""kas' :class:`~tether.modserver.agent_conn.AgentConn`: module calls to agents, routed through the tunnels.

Each call runs the router (same kas, gateway kas, waiting for the agent; kas.md §2.5) in a task of its own.
The router pulls the request messages as the tunnel takes them; agentk's response messages come back through a
small byte-bounded pipe, so a module that reads slowly stalls the tunnel (and with it agentk) instead of
filling kas' memory (issue 9 item 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Coroutine
from typing import Generic, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2

from tether.modserver.agent_conn import AgentCallError, AgentMethod
from tether.tool.grpc_meta import Metadata, MetadataIn, code_from_int, values_to_meta
from tether.tool.relay import BoundedPipe, PipeClosed
from tether.tunnel.server.router import CallerSide, RoutingError
from tether.tunnel.server.tunnel import ValuesMap

__all__ = ["RoutedAgentConn", "RouterLike"]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)

#: Response bytes a call holds for a module that has not read them yet (at least one message): two HTTP chunks.
PIPE_BYTES = 64 * 1024


class RouterLike(Protocol):
    """What a call needs of kas' router (:class:`~tether.tunnel.server.router.Router`, or a stand-in in tests)."""

    async def route(
        self,
        agent_id: int,
        full_method: str,
        metadata: MetadataIn | None,
        caller: CallerSide,
        timeout_s: float | None,
        find_timeout_s: float | None = None,
    ) -> status_pb2.Status | None:
        """Route one call and relay it; see :meth:`Router.route`."""


class _RoutedCall(Generic[Req, Resp]):
    """One routed call: the router's caller side on one end, the module's iteration on the other."""

    def __init__(
        self,
        router: RouterLike,
        agent_id: int,
        method: AgentMethod[Req, Resp],
        requests: AsyncIterable[Req],
        timeout_s: float | None,
        find_timeout_s: float | None,
        metadata: MetadataIn,
    ) -> None:
        self._method = method
        self._requests = aiter(requests)
        self._responses: BoundedPipe[bytes] = BoundedPipe(len, PIPE_BYTES)
        self._header: Metadata = ()
        self._trailer: Metadata = ()
        self._headed = asyncio.Event()
        route = router.route(agent_id, method.full_method, tuple(metadata), self, timeout_s, find_timeout_s)
        self._task = asyncio.get_running_loop().create_task(self._run(route))

    async def _run(self, route: Coroutine[object, object, status_pb2.Status | None]) -> None:
        try:
            status = await route
        except RoutingError as exc:
            self._responses.fail(AgentCallError(exc.code, exc.message, routing=True))
        except PipeClosed:
            pass  # the module cancelled the call
        except asyncio.CancelledError:
            self._responses.fail(AgentCallError(grpc.StatusCode.CANCELLED, "the call was cancelled", routing=False))
            raise
        except Exception as exc:  # e.g. a request message that cannot be serialized: the module sees it
            self._responses.fail(exc)
        else:
            if status is not None and status.code != 0:
                self._responses.fail(AgentCallError(code_from_int(status.code), status.message, routing=False))
            else:
                self._responses.close()
        finally:
            self._headed.set()

    # ---- the router's side (CallerSide) ----------------------------------------------------------

    async def read(self) -> bytes | None:
        """Next serialized request message, or None after the module's last one."""
        try:
            request = await anext(self._requests)
        except StopAsyncIteration:
            return None
        return request.SerializeToString()

    async def send_header(self, meta: ValuesMap) -> None:
        """Keep agentk's response headers."""
        self._header = values_to_meta(meta)
        self._headed.set()

    async def write(self, data: bytes) -> None:
        """Queue one serialized response message, waiting while the module has not read enough."""
        self._headed.set()  # a message means the headers, if any, came before it
        await self._responses.put(data)

    async def set_trailer(self, meta: ValuesMap) -> None:
        """Keep agentk's trailers."""
        self._trailer = values_to_meta(meta)

    # ---- the module's side (AgentCall) -----------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Resp]:
        return self

    async def __anext__(self) -> Resp:
        data = await self._responses.get()
        if data is None:
            raise StopAsyncIteration
        try:
            return self._method.response.FromString(data)
        except DecodeError as exc:
            self.cancel()
            raise AgentCallError(
                grpc.StatusCode.INTERNAL,
                f"undecodable {self._method.response.DESCRIPTOR.name} from the agent: {exc}",
                routing=False,
            ) from exc

    async def initial_metadata(self) -> Metadata:
        await self._headed.wait()
        return self._header

    def trailing_metadata(self) -> Metadata:
        return self._trailer

    def cancel(self) -> None:
        self._responses.abandon()
        self._task.cancel()


class RoutedAgentConn:
    """Calls agents through ``router`` (kas' :class:`~tether.modserver.agent_conn.AgentConn`).

    Args:
        router: kas' router.
    """

    def __init__(self, router: RouterLike) -> None:
        self._router = router

    def call(
        self,
        agent_id: int,
        method: AgentMethod[Req, Resp],
        requests: AsyncIterable[Req],
        *,
        timeout_s: float | None = None,
        find_timeout_s: float | None = None,
        metadata: MetadataIn = (),
    ) -> _RoutedCall[Req, Resp]:
        """Start a routed call; see :meth:`AgentConn.call <tether.modserver.agent_conn.AgentConn.call>`."""
        return _RoutedCall(self._router, agent_id, method, requests, timeout_s, find_timeout_s, metadata)
