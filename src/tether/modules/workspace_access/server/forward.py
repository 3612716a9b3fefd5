"""One authorized request to a running workspace, as a ``WorkspaceAccess.MakeRequest`` call to its agent.

The request becomes ``grpctool.HttpRequest`` frames (HTTP over gRPC, ``tool/http_grpc``'s ``ProxyCall``: the
body streams as it arrives, the response is written as it comes, a ``101`` hands the raw connection over) with a
``WorkspaceTarget`` naming the Service port, sent through ``ServerApi.agent_conn`` (which finds a tunnel of the
workspace's agent on whichever kas holds one). Every wait is bounded: the agent's tunnel (``agent_timeout``; an
agent with no connection at all is reported at once) and the workspace's response head
(``response_header_timeout``). The body and an upgraded connection then run as long as both ends want, with
back-pressure end to end.

Errors before the response head are answered (``pages.error_response``): 502 when the agent is not connected,
its tunnel cannot be found, or it cannot reach the workspace; 504 when the workspace sends no head in time.
After the head, a failure can only cut the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from tether.modserver.agent_conn import AgentCallError, AgentConn, AgentMethod
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.audit import AuditRecord
from tether.modserver.gitlab_client import WorkspaceAuthorization
from tether.modules.workspace_access.rpc.headers import request_headers, response_headers
from tether.modules.workspace_access.server.addresses import WorkspaceAddress
from tether.modules.workspace_access.server.pages import error_response
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.pb.gitlab.agent.workspace_access.rpc import rpc_pb2
from tether.tool.http_grpc.headers import is_upgrade, to_values
from tether.tool.http_grpc.proxy_call import ProxyCall, ResponseStreamError, content_length_of
from tether.tool.tasks import wait_or_abandon

__all__ = ["MAKE_REQUEST", "WorkspaceForwarder"]

log = logging.getLogger(__name__)

#: The agent API that carries workspace requests.
MAKE_REQUEST = AgentMethod(
    "/gitlab.agent.workspace_access.rpc.WorkspaceAccess/MakeRequest",
    grpctool_pb2.HttpRequest,
    grpctool_pb2.HttpResponse,
)
CallMetadata = tuple[tuple[str, str], ...]
#: Seconds without a response head after which the agent tracker is asked whether the agent is connected at all.
_TRACKER_AFTER_S = 0.2


class _Failure(Exception):
    def __init__(self, code: int, title: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.title = title
        self.message = message


def _header_frame(
    request: web.BaseRequest, address: WorkspaceAddress, ws: WorkspaceAuthorization
) -> grpctool_pb2.HttpRequest:
    headers = request_headers(request.headers.items(), address.host, address.scheme, request.remote, address.prefix)
    header = grpctool_pb2.HttpRequest.Header(
        request=prototool_pb2.HttpRequest(method=request.method, header=to_values(headers), url_path=address.path),
        content_length=content_length_of(request),
    )
    header.extra.Pack(
        rpc_pb2.WorkspaceTarget(workspace=ws.name, namespace=ws.namespace, port=address.port, raw_query=address.query)
    )
    return grpctool_pb2.HttpRequest(header=header)


class WorkspaceForwarder:
    """Forwards authorized requests to running workspaces.

    Args:
        agents: calls the agents (``ServerApi.agent_conn``).
        tracker: connected agents (to tell "not connected" from "no tunnel yet").
        agent_timeout_s: how long to wait for a tunnel of the agent.
        response_header_timeout_s: how long the workspace may take to send its response head.
    """

    def __init__(
        self, agents: AgentConn, tracker: AgentTracker, agent_timeout_s: float, response_header_timeout_s: float
    ) -> None:
        self._agents = agents
        self._tracker = tracker
        self._agent_timeout_s = agent_timeout_s
        self._head_timeout_s = response_header_timeout_s

    async def forward(
        self,
        request: web.BaseRequest,
        address: WorkspaceAddress,
        ws: WorkspaceAuthorization,
        metadata: CallMetadata,
        audit: AuditRecord | None = None,
    ) -> web.StreamResponse:
        """Relay ``request`` to port ``address.port`` of workspace ``ws`` and return the response sent.

        ``audit``, when given, counts the bytes relayed each way.
        """
        call = ProxyCall(
            request,
            _header_frame(request, address, ws),
            is_upgrade(request.headers.items()),
            {},
            lambda headers: response_headers(headers, address.prefix),
        )
        if audit is not None:
            audit.counter = call
        route = asyncio.ensure_future(self._call_agent(call, ws.agent_id, metadata))
        watchdog = asyncio.ensure_future(self._watch(call, route, ws))
        try:
            await route
        except AgentCallError as exc:
            if not exc.routing:
                return self._fail(request, call, _agent_failure(ws, exc))
            return self._fail(request, call, _Failure(502, "Agent not reachable", _routing_message(ws, exc)))
        except ResponseStreamError as exc:
            return self._fail(request, call, _Failure(502, "Bad gateway", f"the agent's answer was broken: {exc}"))
        except ConnectionError as exc:
            log.debug("workspace client went away: %r", exc)
            return self._fail(request, call, _Failure(502, "Bad gateway", "the client connection failed"))
        except asyncio.CancelledError:
            failure = _watchdog_failure(watchdog)
            if failure is None:
                raise
            return self._fail(request, call, failure)
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watchdog
            if call.raw is not None:
                call.raw.close()
        if not call.complete:
            return self._fail(request, call, _Failure(502, "Bad gateway", "the workspace ended the response early"))
        assert call.response is not None
        return call.response

    async def _call_agent(self, call: ProxyCall, agent_id: int, metadata: CallMetadata) -> None:
        agent_call = self._agents.call(
            agent_id, MAKE_REQUEST, call.requests(), find_timeout_s=self._agent_timeout_s, metadata=metadata
        )
        try:
            await call.relay(agent_call)
        finally:
            agent_call.cancel()

    async def _watch(self, call: ProxyCall, route: asyncio.Future[None], ws: WorkspaceAuthorization) -> _Failure:
        """Cancel ``route`` when the agent has no connection at all, or when the response head is late."""
        # Most answers start at once: only a slow one costs a look at the agent tracker.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call.wait_head(), _TRACKER_AFTER_S)
            return _Failure(0, "", "")
        try:
            connections = await wait_or_abandon(self._tracker.connections_by_agent_id(ws.agent_id), 2.0)
        except Exception as exc:  # unknown: the router's own bounded wait decides
            log.info("reading the connections of agent %d failed: %r", ws.agent_id, exc)
            connections = None
        if connections == [] and not call.head_sent:
            failure = _Failure(
                502,
                "Agent not connected",
                f"the agent of workspace {ws.name} (agent {ws.agent_id}) is not connected to kas; "
                "the workspace cannot be reached until it connects again",
            )
            route.cancel()
            return failure
        try:
            await asyncio.wait_for(call.wait_head(), max(self._head_timeout_s - _TRACKER_AFTER_S, 0))
        except TimeoutError:
            route.cancel()
            return _Failure(
                504, "Gateway timeout", f"workspace {ws.name} sent no response within {self._head_timeout_s:g} s"
            )
        return _Failure(0, "", "")

    @staticmethod
    def _fail(request: web.BaseRequest, call: ProxyCall, failure: _Failure) -> web.StreamResponse:
        log.info("workspace request failed: %d %s", failure.code, failure.message)
        if not call.head_sent or call.response is None:
            return error_response(request, failure.code, failure.title, failure.message)
        call.abort()  # the head is out: cutting the connection is the only signal left
        return call.response


def _watchdog_failure(watchdog: asyncio.Future[_Failure]) -> _Failure | None:
    if not watchdog.done() or watchdog.cancelled() or watchdog.exception() is not None:
        return None
    failure = watchdog.result()
    current = asyncio.current_task()
    if failure.code == 0 or (current is not None and current.cancelling()):
        return None  # the client went away: its cancellation goes on
    return failure


def _routing_message(ws: WorkspaceAuthorization, exc: AgentCallError) -> str:
    return f"the agent of workspace {ws.name} (agent {ws.agent_id}) cannot be reached through kas: {exc.message}"


def _agent_failure(ws: WorkspaceAuthorization, error: AgentCallError) -> _Failure:
    return _Failure(502, "Workspace not reachable", f"the agent could not reach workspace {ws.name}: {error.message}")
