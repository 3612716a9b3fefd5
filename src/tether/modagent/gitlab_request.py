"""An agent module's HTTP request to the hub, carried by kas' ``gitlab_access`` module.

Upstream ``modagent.Api.MakeGitLabRequest``: the request goes to
``/api/v4/internal/kubernetes/modules/<module>/<path>``; the answer comes back with the hub's status,
headers and body unchanged. The request and answer are encoded and decoded by ``tool/http_grpc`` (order
checked by the automaton of the ``.proto`` options).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from grpc import aio

from tether.pb.gitlab.agent.gitlab_access.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.grpc_meta import Metadata
from tether.tool.http_grpc.buffered import HttpStreamError, read_response, request_frames

_CHUNK_BYTES = 64 * 1024
#: The largest answer accepted from the hub, in bytes (a full reconcile answer of a few thousand workspaces).
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
#: grpcio's details for a request message it could not send because the call had already ended.
_CORE_SEND_FAILED = "Internal error from Core"
#: Codes after which the same request may simply be sent again later.
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


class GitlabRequestError(Exception):
    """The request did not reach the hub or its answer was lost; ``retryable`` says whether to try again."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class GitlabResponse:
    """The hub's answer: status code, headers (name -> values) and body."""

    status: int
    headers: dict[str, list[str]]
    body: bytes


async def make_gitlab_request(
    channel: aio.Channel,
    metadata: Metadata,
    module_name: str,
    path: str,
    *,
    method: str = "GET",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> GitlabResponse:
    """Send one module request through kas.

    Args:
        channel: the connection to kas.
        metadata: the call metadata carrying ``authorization: Bearer <agent token>``.
        module_name: the calling module, e.g. ``remote_development``.
        path: the module path, e.g. ``/reconcile``.
        method: the HTTP method.
        body: the request body (JSON).
        headers: extra request headers.
        timeout_s: deadline of the whole call in seconds.

    Raises:
        GitlabRequestError: kas refused the call or the hub could not be reached (``retryable`` for
            UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, and for grpcio's own INTERNAL when kas ended the
            call before the request was sent, which hides kas' status).
    """
    extra = any_pb2.Any()
    extra.Pack(rpc_pb2.HeaderExtra(module_name=module_name))
    request = prototool_pb2.HttpRequest(method=method, url_path=path)
    for key, value in (headers or {}).items():
        request.header[key].value.append(value)
    request.header["Content-Type"].value.append("application/json")
    header = grpctool_pb2.HttpRequest.Header(request=request, extra=extra, content_length=len(body))

    async def messages() -> AsyncIterator[grpctool_pb2.HttpRequest]:
        for frame in request_frames(header, body, _CHUNK_BYTES):
            yield frame

    stub = rpc_pb2_grpc.GitlabAccessStub(channel)
    try:
        call = stub.MakeRequest(messages(), metadata=tuple(metadata), timeout=timeout_s)
        answer = await read_response(call, MAX_RESPONSE_BYTES)
    except aio.AioRpcError as exc:
        # grpcio reports a request frame it could not send because kas had already ended the call as its own
        # INTERNAL, losing kas' status (e.g. UNAVAILABLE while the hub is down): the call may be tried again.
        lost = exc.code() is grpc.StatusCode.INTERNAL and exc.details() == _CORE_SEND_FAILED
        raise GitlabRequestError(
            f"{module_name}{path} through kas: {exc.code().name}: {exc.details()}", exc.code() in RETRYABLE or lost
        ) from exc
    except HttpStreamError as exc:
        call.cancel()
        raise GitlabRequestError(f"{module_name}{path} through kas: {exc.message}", True) from exc
    headers_out = {key: list(values.value) for key, values in answer.head.header.items()}
    return GitlabResponse(answer.head.status_code, headers_out, answer.body)
