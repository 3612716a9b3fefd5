"""The one status error type and its mappings to gRPC, HTTP and WebSocket close codes."""

import grpc
import pytest

from tether.modserver.agent_auth import AuthError
from tether.modules.graph.server.websocket import GraphStreamError
from tether.modules.kubernetes_api.agent.forward import AgentRequestError
from tether.tool.status import StatusError, http_code, websocket_close_code
from tether.tunnel.server.gateway import GatewayError
from tether.tunnel.server.gateway_call import GatewayUnavailable
from tether.tunnel.server.router import RoutingError


@pytest.mark.parametrize(
    "kind", [RoutingError, GatewayError, GatewayUnavailable, AgentRequestError, GraphStreamError, AuthError]
)
def test_every_grpc_shaped_failure_is_a_status_error(kind: type[StatusError]) -> None:
    error = kind(grpc.StatusCode.PERMISSION_DENIED, "no")
    assert isinstance(error, StatusError)
    assert (error.code, error.message, str(error)) == (grpc.StatusCode.PERMISSION_DENIED, "no", "no")
    proto = error.to_proto()
    assert (proto.code, proto.message) == (grpc.StatusCode.PERMISSION_DENIED.value[0], "no")
    assert (error.http_code, error.websocket_close_code) == (403, 1008)


@pytest.mark.parametrize(
    ("code", "http", "ws"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, 1007),
        (grpc.StatusCode.UNAUTHENTICATED, 401, 1008),
        (grpc.StatusCode.PERMISSION_DENIED, 403, 1008),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, 1013),
        (grpc.StatusCode.UNAVAILABLE, 502, 1013),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 502, 1013),
        (grpc.StatusCode.CANCELLED, 502, 1001),
        (grpc.StatusCode.INTERNAL, 502, 1011),
        (grpc.StatusCode.UNKNOWN, 502, 1011),
    ],
)
def test_one_mapping_to_http_and_websocket(code: grpc.StatusCode, http: int, ws: int) -> None:
    assert (http_code(code), websocket_close_code(code)) == (http, ws)


async def test_abort_ends_the_call_with_the_status() -> None:
    class Context:
        aborted: tuple[grpc.StatusCode, str] | None = None

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            self.aborted = (code, details)
            raise RuntimeError("aborted")

    context = Context()
    with pytest.raises(RuntimeError, match="aborted"):
        await RoutingError(grpc.StatusCode.UNAVAILABLE, "gateway kas failed").abort(context)  # type: ignore[arg-type]
    assert context.aborted == (grpc.StatusCode.UNAVAILABLE, "gateway kas failed")
