"""agentk half of workspace access: ``WorkspaceAccess.MakeRequest`` on the internal server.

Each call carries one HTTP request for a workspace port (``header`` with a ``WorkspaceTarget`` in ``extra``,
``data``*, ``trailer``, then ``upgradeData``* after a ``101``). agentk resolves the Service's port to a ready
endpoint (``endpoints.py``) and sends the request there over plain HTTP with the original ``Host``, without the
caller's credentials (kas applied the header allow-list of ``rpc/headers.py``; agentk applies it again), and
streams the response back (``tool/http_grpc``'s ``OutboundHttp``: chunks of at most 32 KiB as they arrive, raw
bytes both ways after a ``101``). Failures end the call with a status whose message kas shows the user: NOT_FOUND or
PERMISSION_DENIED from resolving, UNAVAILABLE when the workspace cannot be reached.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import grpc
import structlog
import yarl

from tether.modules.workspace_access.agent.endpoints import EndpointResolver
from tether.modules.workspace_access.rpc.headers import KAS_SET_HEADERS, workspace_request_headers
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2
from tether.tool.http_grpc.headers import from_values, is_upgrade, via_value
from tether.tool.http_grpc.outbound import (
    OUTBOUND_ERRORS,
    AgentRequestError,
    MakeRequestServicer,
    OutboundHttp,
    RequestFrames,
    Send,
)

__all__ = ["SERVICE", "WorkspaceAccessAgent"]

_log = structlog.get_logger(__name__)

SERVICE = "gitlab.agent.workspace_access.rpc.WorkspaceAccess"
#: TCP connect limit towards a workspace, seconds.
CONNECT_TIMEOUT_S = 10.0
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse


def _target(header: _Request.Header) -> rpc_pb2.WorkspaceTarget:
    target = rpc_pb2.WorkspaceTarget()
    if not header.HasField("extra") or not header.extra.Unpack(target):
        raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, "the request names no workspace (WorkspaceTarget)")
    if not (_NAME.fullmatch(target.workspace) and _NAME.fullmatch(target.namespace) and 0 < target.port < 65536):
        raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, "WorkspaceTarget: invalid name, namespace or port")
    if not header.request.url_path.startswith("/"):
        raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, "url_path must start with '/'")
    return target


class WorkspaceAccessAgent(MakeRequestServicer):
    """Serves ``WorkspaceAccess.MakeRequest``; use inside a running event loop, :meth:`close` when done.

    Args:
        resolver: Service port -> ready endpoint.
        connect_timeout_s: limit for connecting to a workspace, seconds.
    """

    def __init__(self, resolver: EndpointResolver, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        super().__init__(OutboundHttp(None, connect_timeout_s))
        self._resolver = resolver
        #: This agent's id, from its configuration; 0 until the first configuration arrived.
        self.agent_id = 0

    async def serve(self, requests: AsyncIterator[_Request], send: Send) -> None:
        """Make the HTTP request carried by ``requests`` to its workspace and ``send`` the response frames.

        Raises:
            StatusError: INVALID_ARGUMENT (broken request stream or target), NOT_FOUND / PERMISSION_DENIED /
                UNAVAILABLE from resolving the Service, UNAVAILABLE when the workspace could not be reached or
                failed mid-response.
        """
        frames = RequestFrames(requests)
        header = await frames.header()
        target = _target(header)
        if not self.agent_id:
            raise AgentRequestError(grpc.StatusCode.UNAVAILABLE, "agentk has not received its configuration yet")
        endpoint = await self._resolver.resolve(target.namespace, target.workspace, target.port, self.agent_id)
        incoming = from_values(header.request.header)
        host = next((v for k, v in incoming if k.lower() == "host"), f"{endpoint.host}:{endpoint.port}")
        # kas applied the same allow-list: checked again, so that no other kas version or bug leaks credentials.
        cleaned = workspace_request_headers(incoming, keep=KAS_SET_HEADERS)
        headers = [(k, v) for k, values in cleaned.items() for v in values]
        headers += [("Host", host), ("Via", via_value("gRPC/1.0", "gitlab-agent"))]
        url = yarl.URL.build(
            scheme="http",
            host=endpoint.host,
            port=endpoint.port,
            path=header.request.url_path,
            query_string=target.raw_query,
            encoded=True,
        )
        try:
            await self._http.forward(frames, header, url, headers, is_upgrade(incoming), send)
        except OUTBOUND_ERRORS as exc:
            self._resolver.forget(target.namespace, target.workspace, target.port)
            where = f"{target.namespace}/{target.workspace} port {target.port} ({endpoint.host}:{endpoint.port})"
            _log.info("workspace_request_failed", workspace=target.workspace, error=repr(exc))
            raise AgentRequestError(grpc.StatusCode.UNAVAILABLE, f"connecting to {where} failed: {exc!r}") from exc
