"""Whole-request HTTP over gRPC (``tool/http_grpc/buffered.py``): the frame order is the ``.proto``'s on both sides.

agentk's requests to the hub (``make_gitlab_request``) used to accept any answer order: a ``data`` frame after the
``trailer`` was appended to the body. The request side (kas' ``gitlab_access``) is covered end to end by
``tests/e2e/test_gitlab_access.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from tether.modagent.gitlab_request import GitlabRequestError, make_gitlab_request
from tether.pb.gitlab.agent.gitlab_access.rpc import rpc_pb2_grpc
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.http_grpc.buffered import HttpStreamError, read_request, request_frames, response_frames

_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse
HEAD = prototool_pb2.HttpResponse(status_code=200, status="200 OK")


async def _stream(messages: list[Any]) -> AsyncIterator[Any]:
    for message in messages:
        yield message


class AnsweringKas(rpc_pb2_grpc.GitlabAccessServicer):
    """A kas whose ``MakeRequest`` reads the request and answers with ``frames``."""

    def __init__(self, frames: list[_Response]) -> None:
        self.frames = frames

    async def MakeRequest(self, request_iterator: Any, context: Any) -> AsyncIterator[_Response]:  # type: ignore[override]
        async for _ in request_iterator:
            pass
        for frame in self.frames:
            yield frame


async def _request_through(frames: list[_Response]) -> Any:
    server = aio.server()
    rpc_pb2_grpc.add_GitlabAccessServicer_to_server(AnsweringKas(frames), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return await make_gitlab_request(channel, (), "remote_development", "/reconcile", body=b"{}", timeout_s=10)
    finally:
        await server.stop(None)


async def test_make_gitlab_request_reads_a_well_ordered_answer() -> None:
    answer = await _request_through(list(response_frames(HEAD, b"x" * 70_000, 32 * 1024)))
    assert (answer.status, len(answer.body)) == (200, 70_000)


@pytest.mark.parametrize(
    "frames",
    [
        [
            _Response(header=_Response.Header(response=HEAD)),
            _Response(trailer=_Response.Trailer()),
            _Response(data=_Response.Data(data=b"late")),
        ],
        [_Response(data=_Response.Data(data=b"early")), _Response(header=_Response.Header(response=HEAD))],
        [_Response(header=_Response.Header(response=HEAD)), _Response(data=_Response.Data(data=b"no trailer"))],
    ],
    ids=["data_after_trailer", "data_before_header", "no_trailer"],
)
async def test_make_gitlab_request_refuses_an_answer_out_of_order(frames: list[_Response]) -> None:
    with pytest.raises(GitlabRequestError) as error:
        await _request_through(frames)
    assert error.value.retryable


async def test_read_request_applies_the_order_and_the_limits() -> None:
    header = _Request.Header(request=prototool_pb2.HttpRequest(method="POST", url_path="/x"))
    whole = await read_request(_stream(list(request_frames(header, b"abc" * 10, 4))), 100)
    assert (whole.header.request.url_path, whole.body) == ("/x", b"abc" * 10)
    cases: list[tuple[list[_Request], grpc.StatusCode]] = [
        ([_Request(trailer=_Request.Trailer())], grpc.StatusCode.INVALID_ARGUMENT),
        ([_Request(header=header), _Request(header=header)], grpc.StatusCode.INVALID_ARGUMENT),
        ([_Request(header=header)], grpc.StatusCode.INVALID_ARGUMENT),
        (
            [_Request(header=header), _Request(upgradeData=_Request.UpgradeData(data=b"x"))],
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (list(request_frames(header, b"y" * 101, 50)), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ]
    for messages, code in cases:
        with pytest.raises(HttpStreamError) as error:
            await read_request(_stream(messages), 100)
        assert error.value.code == code, messages
