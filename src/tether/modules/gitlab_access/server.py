"""kas half of ``gitlab_access``: ``GitlabAccess.MakeRequest`` on the agent listener (modules.md).

One call is one HTTP request of an agentk module: a ``Header`` (method, path, query, headers, and
``HeaderExtra.module_name`` in ``extra``), ``Data`` chunks, a ``Trailer``, read with ``tool/http_grpc``
(order checked by the automaton of the ``.proto`` options). kas authenticates the agent token,
sends the request to ``/api/v4/internal/kubernetes/modules/<module>/<path>`` with its JWT and the agent token,
and streams the hub's answer back unchanged (status, headers, body). Upgrades are refused
(``UpgradeData`` or an ``Upgrade`` header: FAILED_PRECONDITION). A hub that cannot be reached gives
UNAVAILABLE, which agentk retries.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import aiohttp
import grpc

from tether.modserver.agent_auth import AgentAuthenticator, AuthError, bearer_token
from tether.modserver.api import ServerApi
from tether.modserver.gitlab_client import GitlabClient, GitlabClientError, GitlabTimeout
from tether.modshared.module import IdleModule, Module
from tether.modules.gitlab_access import MODULE_NAME
from tether.pb.gitlab.agent.gitlab_access.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.http_grpc.buffered import HttpStreamError, read_request, response_frames

log = logging.getLogger(__name__)

#: Largest request body an agent module may send (a full reconcile of a few thousand workspaces).
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: Chunk size of the answer's ``Data`` messages.
CHUNK_BYTES = 64 * 1024
_MODULE_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_SAFE_PATH = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;=:@-]+)+/?$")
#: Headers not passed on: hop-by-hop, credentials (kas adds its own), and the ones aiohttp computes.
_DROPPED = frozenset(
    {
        "authorization",
        "gitlab-agent-api-request",
        "gitlab-agentk-api-request",
        "gitlab-kas-api-request",
        "cookie",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    }
)


def check_path(path: str) -> str:
    """The module path if safe: starts with ``/``, no empty, ``.`` or ``..`` segments, no escapes.

    A module must not be able to leave its own ``/modules/<module>/`` prefix.

    Raises:
        ValueError: the path is not safe, with the reason.
    """
    if not _SAFE_PATH.match(path):
        raise ValueError(f"module path {path[:100]!r} must start with / and hold only plain segments")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ValueError(f"module path {path[:100]!r} must not contain . or .. segments")
    return path


def _header_values(header: dict[str, prototool_pb2.Values]) -> dict[str, str]:
    return {key: ", ".join(values.value) for key, values in header.items() if key.lower() not in _DROPPED}


class GitlabAccessServicer(rpc_pb2_grpc.GitlabAccessServicer):
    """``GitlabAccess`` on the agent listener.

    Args:
        auth: resolves the calling agent's token.
        gitlab: the hub's internal API client.
    """

    def __init__(self, auth: AgentAuthenticator, gitlab: GitlabClient) -> None:
        self._auth = auth
        self._gitlab = gitlab

    async def MakeRequest(
        self,
        request_iterator: AsyncIterator[grpctool_pb2.HttpRequest],
        context: grpc.aio.ServicerContext[grpctool_pb2.HttpRequest, grpctool_pb2.HttpResponse],
    ) -> AsyncIterator[grpctool_pb2.HttpResponse]:
        """Forward one module request to the hub and stream the answer back."""
        try:
            agent = await self._auth.authenticate(context.invocation_metadata())
        except AuthError as exc:
            await context.abort(exc.code, exc.message)
        token = bearer_token(context.invocation_metadata())
        try:
            received = await read_request(request_iterator, MAX_REQUEST_BYTES, _check_header)
        except HttpStreamError as exc:
            await exc.abort(context)
        request = received.header.request
        module = _module_name(received.header)
        try:
            response = await self._gitlab.module_request(
                token,
                module,
                request.url_path,
                request.method or "GET",
                query=[(key, value) for key, values in request.query.items() for value in values.value],
                headers=_header_values(dict(request.header)),
                body=received.body,
            )
        except GitlabClientError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, f"hub answer refused: {exc.reason}")
        except GitlabTimeout as exc:
            log.warning("gitlab_access: %s", exc, extra={"agent_id": agent.agent_id})
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("gitlab_access: hub unreachable for agent %d module %s: %s", agent.agent_id, module, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the hub cannot be reached: {type(exc).__name__}")
        head = prototool_pb2.HttpResponse(status_code=response.status, status=f"{response.status} {response.reason}")
        for key, values in response.headers.items():
            head.header[key].value.extend(values)
        for frame in response_frames(head, response.body, CHUNK_BYTES):
            yield frame


def _check_header(header: grpctool_pb2.HttpRequest.Header) -> None:
    """Refuse a header naming no module, an unsafe path, or an upgrade, before its body is read."""
    _module_name(header)
    try:
        check_path(header.request.url_path)
    except ValueError as exc:
        raise HttpStreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
    if any(key.lower() == "upgrade" for key in header.request.header):
        raise HttpStreamError(grpc.StatusCode.FAILED_PRECONDITION, "connection upgrade is not supported")


def _module_name(header: grpctool_pb2.HttpRequest.Header) -> str:
    extra = rpc_pb2.HeaderExtra()
    if not header.HasField("extra") or not header.extra.Unpack(extra):
        raise HttpStreamError(grpc.StatusCode.INVALID_ARGUMENT, "header.extra must hold gitlab_access HeaderExtra")
    if not _MODULE_NAME.match(extra.module_name):
        raise HttpStreamError(
            grpc.StatusCode.INVALID_ARGUMENT, "HeaderExtra.module_name must be a module name, e.g. remote_development"
        )
    return extra.module_name


class GitlabAccessServerFactory:
    """kas half of ``gitlab_access``: ``GitlabAccess`` on the agent listener."""

    name = MODULE_NAME

    def new(self, api: ServerApi) -> Module:
        """Register the servicer on the agent listener."""
        rpc_pb2_grpc.add_GitlabAccessServicer_to_server(GitlabAccessServicer(api.auth, api.gitlab), api.agent_server)
        return IdleModule(self.name)
