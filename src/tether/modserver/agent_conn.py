"""The one way a kas module calls its agent's API (upstream ``modserver.Config.AgentConn``).

Upstream hands every module a gRPC client connection whose calls reach agentk through the tunnels; which kas
holds a tunnel, the hop through a gateway kas and the wait for an agent that is not connected yet all stay
behind it (kas.md §2.5). :class:`AgentConn` is that connection here: a module names the agent, the method
(:class:`AgentMethod`, typed by its request and response messages), the deadline and the metadata, and gets
an :class:`AgentCall` that streams the agent's answer; :func:`unary` is the one-request, one-response case.
Failures are :class:`AgentCallError` (a :class:`~tether.tool.status.StatusError`), telling a path that could
not be found or broke (``routing``) from the agent's own failure status.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from tether.tool.grpc_meta import Metadata, MetadataIn
from tether.tool.status import StatusError

__all__ = ["AgentCall", "AgentCallError", "AgentConn", "AgentIdFromRequest", "AgentMethod", "unary"]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
Resp_co = TypeVar("Resp_co", bound=Message, covariant=True)

#: Reads the destination agent id from a method's first serialized request message; raises ValueError if absent.
AgentIdFromRequest = Callable[[bytes], int]


@dataclass(frozen=True)
class AgentMethod(Generic[Req, Resp]):
    """One method of an agent API, typed by its messages.

    Attributes:
        full_method: ``/package.Service/Method`` as agentk serves it.
        request: the request message class.
        response: the response message class.
    """

    full_method: str
    request: type[Req]
    response: type[Resp]


class AgentCallError(StatusError):
    """A call to an agent failed with gRPC status ``code`` and ``message``.

    Attributes:
        routing: True when kas found no path to the agent in time, or the path broke during the call (then the
            code is DEADLINE_EXCEEDED or UNAVAILABLE, upstream's routing errors, kas.md §2.5); False when the
            agent answered with this failure status.
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, routing: bool) -> None:
        super().__init__(code, message)
        self.routing = routing


class AgentCall(Protocol[Resp_co]):
    """One call in flight: iterate it for the agent's response messages, in order.

    The iteration ends at the agent's clean end of the call and raises :class:`AgentCallError` on a failure.
    Leaving the iteration early does not end the call: :meth:`cancel` does (always call it, e.g. in a
    ``finally``; it is a no-op once the call ended).
    """

    def __aiter__(self) -> AsyncIterator[Resp_co]:
        """The response messages."""

    async def initial_metadata(self) -> Metadata:
        """The agent's response headers, once known (a response message or the end of the call settles it)."""

    def trailing_metadata(self) -> Metadata:
        """The agent's trailers, once the iteration ended (empty before)."""

    def cancel(self) -> None:
        """End the call: the path to the agent is released and the agent's handler is cancelled."""


class AgentConn(Protocol):
    """A gRPC-client-connection-like object whose calls reach any agent (upstream ``AgentConn``)."""

    def call(
        self,
        agent_id: int,
        method: AgentMethod[Req, Resp],
        requests: AsyncIterable[Req],
        *,
        timeout_s: float | None = None,
        find_timeout_s: float | None = None,
        metadata: MetadataIn = (),
    ) -> AgentCall[Resp]:
        """Start a call to ``method`` of agent ``agent_id``; the request messages are read as the call needs them.

        Args:
            agent_id: the destination agent.
            method: the agent API method.
            requests: the request messages; their end is the caller's half-close.
            timeout_s: the call's deadline in seconds, or None. It bounds the whole call and travels to agentk.
            find_timeout_s: without ``timeout_s``, how long to wait for a path to the agent (None: the
                ``routing.tunnel_find_timeout`` setting).
            metadata: call metadata for agentk (``authorization`` and kas' own ``kas-hop-*`` entries are dropped).
        """


async def unary(
    conn: AgentConn,
    agent_id: int,
    method: AgentMethod[Req, Resp],
    request: Req,
    *,
    timeout_s: float | None = None,
    metadata: MetadataIn = (),
) -> Resp:
    """Call a unary agent method: one request, one response.

    Raises:
        AgentCallError: the call failed, or the agent answered with no response or more than one (INTERNAL).
    """

    async def one() -> AsyncIterator[Req]:
        yield request

    call = conn.call(agent_id, method, one(), timeout_s=timeout_s, metadata=metadata)
    responses: list[Resp] = []
    try:
        async for response in call:
            responses.append(response)
    finally:
        call.cancel()
    if len(responses) != 1:
        raise AgentCallError(
            grpc.StatusCode.INTERNAL,
            f"{method.full_method}: the agent answered with {len(responses)} messages instead of one",
            routing=False,
        )
    return responses[0]
