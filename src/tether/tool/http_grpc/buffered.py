"""HTTP over gRPC for requests and responses small enough to hold in memory, both directions.

agentk's requests to the hub (upstream ``MakeGitLabRequest``, carried by kas' ``gitlab_access``) are whole JSON
documents: the calling side encodes the request with :func:`request_frames` and decodes the answer with
:func:`read_response`; the serving side decodes the request with :func:`read_request` and encodes the answer
with :func:`response_frames`. Both readers check the frame order with the automaton of the ``.proto`` options
(``grpctool.HttpRequest`` / ``HttpResponse``, kas.md §5.2) and bound the body.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterator
from dataclasses import dataclass

import grpc

from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.status import StatusError

__all__ = [
    "BufferedRequest",
    "BufferedResponse",
    "HttpStreamError",
    "read_request",
    "read_response",
    "request_frames",
    "response_frames",
]

_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse


class HttpStreamError(StatusError):
    """An HTTP-over-gRPC stream that cannot be accepted, with the gRPC status to end the call with."""


@dataclass(frozen=True)
class BufferedRequest:
    """A whole request: its ``header`` frame and its body."""

    header: _Request.Header
    body: bytes


@dataclass(frozen=True)
class BufferedResponse:
    """A whole response: its head (status, headers) and its body."""

    head: prototool_pb2.HttpResponse
    body: bytes


def _chunks(body: bytes, chunk_bytes: int) -> Iterator[bytes]:
    return (body[start : start + chunk_bytes] for start in range(0, len(body), chunk_bytes))


def request_frames(header: _Request.Header, body: bytes, chunk_bytes: int) -> Iterator[_Request]:
    """``header``, the body as ``data`` frames of at most ``chunk_bytes``, then ``trailer``."""
    yield _Request(header=header)
    for chunk in _chunks(body, chunk_bytes):
        yield _Request(data=_Request.Data(data=chunk))
    yield _Request(trailer=_Request.Trailer())


def response_frames(head: prototool_pb2.HttpResponse, body: bytes, chunk_bytes: int) -> Iterator[_Response]:
    """``header`` with ``head``, the body as ``data`` frames of at most ``chunk_bytes``, then ``trailer``."""
    yield _Response(header=_Response.Header(response=head))
    for chunk in _chunks(body, chunk_bytes):
        yield _Response(data=_Response.Data(data=chunk))
    yield _Response(trailer=_Response.Trailer())


async def read_request(
    messages: AsyncIterable[_Request],
    max_body_bytes: int,
    check_header: Callable[[_Request.Header], None] | None = None,
) -> BufferedRequest:
    """Read a request up to its ``trailer``; upgrades are refused (the serving side of a plain request).

    Args:
        messages: the call's request messages.
        max_body_bytes: the largest body accepted.
        check_header: called with the header as soon as it arrives (before the body is read); raises
            :class:`HttpStreamError` to refuse the request.

    Raises:
        HttpStreamError: INVALID_ARGUMENT for frames out of order or a stream that ends before its trailer,
            FAILED_PRECONDITION for ``upgradeData``, RESOURCE_EXHAUSTED for a body over ``max_body_bytes``,
            or what ``check_header`` raised.
    """
    automaton = StreamAutomaton(_Request)
    header: _Request.Header | None = None
    body = bytearray()
    async for message in messages:
        if message.WhichOneof("message") == "upgradeData":
            raise HttpStreamError(grpc.StatusCode.FAILED_PRECONDITION, "connection upgrade is not supported")
        try:
            kind = automaton.visit(message)
        except StreamOrderError as exc:
            raise HttpStreamError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid request stream: {exc}") from exc
        if kind == "header":
            header = message.header
            if check_header is not None:
                check_header(header)
        elif kind == "data":
            body += message.data.data
            if len(body) > max_body_bytes:
                raise HttpStreamError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"request body larger than {max_body_bytes} bytes"
                )
        elif kind == "trailer":
            assert header is not None  # the automaton allows a trailer only after the header
            return BufferedRequest(header, bytes(body))
    raise HttpStreamError(grpc.StatusCode.INVALID_ARGUMENT, "the request ended before its trailer")


async def read_response(messages: AsyncIterable[_Response], max_body_bytes: int) -> BufferedResponse:
    """Read a whole response, to the end of the stream (the calling side of a plain request).

    Raises:
        HttpStreamError: INTERNAL for frames out of order (anything after the ``trailer`` included), a stream
            without its header or trailer, or ``upgradeData``; RESOURCE_EXHAUSTED for a body over
            ``max_body_bytes``.
        Exception: whatever iterating ``messages`` raised (the call's own failure).
    """
    automaton = StreamAutomaton(_Response)
    head: prototool_pb2.HttpResponse | None = None
    body = bytearray()
    complete = False
    async for message in messages:
        try:
            kind = automaton.visit(message)
        except StreamOrderError as exc:
            raise HttpStreamError(grpc.StatusCode.INTERNAL, f"invalid response stream: {exc}") from exc
        if kind == "header":
            head = message.header.response
        elif kind == "data":
            body += message.data.data
            if len(body) > max_body_bytes:
                raise HttpStreamError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"response body larger than {max_body_bytes} bytes"
                )
        elif kind == "trailer":
            complete = True
        else:
            raise HttpStreamError(grpc.StatusCode.INTERNAL, "upgrade data in the response to a plain request")
    if not complete or head is None:
        raise HttpStreamError(grpc.StatusCode.INTERNAL, "the response ended before its trailer")
    return BufferedResponse(head, bytes(body))
