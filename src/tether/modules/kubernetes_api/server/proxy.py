"""kas' Kubernetes API proxy listener (kas.md §5.1, §5.3): HTTP in, routed ``MakeRequest`` calls out.

Each request under ``url_path_prefix`` is checked (CORS, credentials, nested impersonation; kas.md §4.5),
rewritten and sent to its agent as ``MakeRequest`` through ``ServerApi.agent_conn`` (HTTP over gRPC:
``tool/http_grpc``; the agent may be connected to any kas). The request's own ``timeout`` query parameter
(client-go sends it for ``--request-timeout``) bounds the wait for the agent; without one,
``routing.tunnel_find_timeout`` does. A client that disconnects cancels its handler and with it the agent call.

Every path under the prefix reaches the cluster as the identity the proxy imposes (``access_as: user``:
impersonation; kas.md §4.5): paths kas serves itself (today the Graph API's ``/graph``, registered by the
``graph`` module with ``ServerApi.register_proxy_path``) receive that identity and must compute their answer
with it or refuse; every other path is relayed as ``MakeRequest`` carrying it (issue 9 item 1).

Errors kas produces are Kubernetes ``Status`` bodies (``status.py``): 400 outside the prefix, 401 for
credentials, 403 for CORS and nested impersonation, 500 when the hub fails, 502 when the tunnel or agent
fails, 504 when no agent connection was found in time. Once the response head is sent, a failure cuts the
connection instead, except for a watch, which ends with its terminating chunk (the client watches again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from tether.modserver.agent_conn import AgentCallError, AgentConn, AgentMethod
from tether.modserver.api import ProxyPathHandler
from tether.modserver.audit import REQUEST_KEY, AuditRecord, AuditSink
from tether.modserver.gitlab_client import GitlabClient, ProxyUserAuthorization
from tether.modules import audit as audit_module  # its recording code loads with the first recorded session
from tether.modules.kubernetes_api.rpc.impersonation import NESTED_IMPERSONATION, carries_impersonation
from tether.modules.kubernetes_api.server.audit import (
    audit_credentials,
    audit_identity,
    audit_session,
    audit_target,
)
from tether.modules.kubernetes_api.server.auth import (
    ProxyCredentials,
    ProxyUserAuthorizer,
    credentials_from,
    impersonation_for,
)
from tether.modules.kubernetes_api.server.config import KubernetesApiCF
from tether.modules.kubernetes_api.server.cors import cors_headers, is_preflight, preflight_response
from tether.modules.kubernetes_api.server.recording import session_recorder
from tether.modules.kubernetes_api.server.request_head import request_header
from tether.modules.kubernetes_api.server.status import ProxyError, status_response
from tether.modules.kubernetes_api.server.usage import ProxyUsage
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.tool import tracing
from tether.tool.durations import parse_duration
from tether.tool.http_grpc.headers import is_upgrade
from tether.tool.http_grpc.proxy_call import ProxyCall, ResponseStreamError
from tether.tool.http_server import RELAYED_API_HEADERS, relay_server, start_site
from tether.tool.logs import REQUEST_ID_METADATA, bind, new_request_id
from tether.tool.rate_limit import RateLimiter, per_minute
from tether.tool.status import http_code

if TYPE_CHECKING:
    from tether.tool.tracing_sdk import Tracer

__all__ = ["MAKE_REQUEST", "KubernetesApiProxy"]

log = logging.getLogger(__name__)

#: The agent API that carries proxied requests (kas.md §5.2).
MAKE_REQUEST = AgentMethod(
    "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest", grpctool_pb2.HttpRequest, grpctool_pb2.HttpResponse
)


#: Metadata kas adds to an agent call (the request id).
CallMetadata = tuple[tuple[str, str], ...]


def is_watch(request: web.BaseRequest) -> bool:
    """Whether ``request`` is a Kubernetes watch (``?watch=true``/``1``, or a legacy ``/watch/`` path)."""
    if request.rel_url.query.get("watch", "").lower() in ("true", "1"):
        return True
    return "/watch/" in request.rel_url.path


def request_timeout_s(request: web.BaseRequest) -> float | None:
    """The client's own timeout from the ``timeout`` query parameter (e.g. ``32s``), or None."""
    text = request.rel_url.query.get("timeout")
    if not text:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


class KubernetesApiProxy:
    """The HTTP listener at ``agent.kubernetes_api.listen``.

    Args:
        config: the ``agent.kubernetes_api`` section.
        agents: calls the agents (``ServerApi.agent_conn``).
        authorizer: checks credentials with the hub.
        external_url: ``gitlab.external_url`` for CORS, or None (no CORS checks).
        limiter: counts refused credentials per source address, or None.
        paths: paths under the prefix that kas answers itself (``ServerApi.proxy_paths``).
        usage: counts authorized requests under upstream's usage names, or None.
        audit: where each request is recorded, refused ones too (``ServerApi.audit``; issue 25 item 1).
        gitlab: the hub's client, where recorded sessions are stored (issue 25 item 2), or None.
        recording_budget: the bytes all recorded sessions share (``session_recording_max_total_bytes``), or None.
    """

    def __init__(
        self,
        config: KubernetesApiCF,
        agents: AgentConn,
        authorizer: ProxyUserAuthorizer,
        external_url: str | None,
        limiter: RateLimiter | None = None,
        paths: Mapping[str, ProxyPathHandler] | None = None,
        usage: ProxyUsage | None = None,
        audit: AuditSink | None = None,
        gitlab: GitlabClient | None = None,
        recording_budget: audit_module.RecordingBudget | None = None,
    ) -> None:
        self._usage = usage
        self._recording_budget = recording_budget
        self._config = config
        self._audit = audit if audit is not None else AuditSink()
        self._gitlab = gitlab
        self._limiter = limiter if config.failed_auth_per_source_per_minute > 0 else None
        self._failure_limit = per_minute(max(config.failed_auth_per_source_per_minute, 1))
        self._agents = agents
        self._authorizer = authorizer
        self._external_url = external_url
        self._prefix = config.url_path_prefix
        server = relay_server(self._handle, RELAYED_API_HEADERS)
        self._runner = web.ServerRunner(server, shutdown_timeout=config.listen.shutdown_grace_period)
        # Agent calls of the watches in flight: ended cleanly when kas shuts down.
        self._watches: set[asyncio.Future[None]] = set()
        self._ending_watches = False
        #: Paths under the prefix that kas answers itself instead of relaying ``MakeRequest``.
        self._paths: Mapping[str, ProxyPathHandler] = paths if paths is not None else {}

    async def start(self) -> int:
        """Bind and serve; return the bound TCP port (0 for a unix socket).

        Raises:
            OSError: the address cannot be bound.
            ssl.SSLError: the certificate or key cannot be loaded.
        """
        listen = self._config.listen
        if listen.network != "unix" and (listen.certificate_file is None or listen.key_file is None):
            # client-go attaches bearer tokens only over TLS: kubectl sends none to a plain HTTP server.
            log.warning("the Kubernetes API proxy listens without TLS; kubectl will not send tokens to it")
        return await start_site(self._runner, listen.network, listen.address, listen.certificate_file, listen.key_file)

    async def stop(self) -> None:
        """Stop accepting, end watches cleanly, let other requests run for ``shutdown_grace_period``, then cut them.

        A watch never ends by itself, so waiting the grace period would only end it by cutting the connection;
        instead it ends at once with its terminating chunk, as the API server does on shutdown, and the client
        watches again through another kas (issue 9 item 7).
        """
        self._ending_watches = True
        for route in list(self._watches):
            route.cancel()
        await self._runner.cleanup()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        request_id = new_request_id()
        path = request.rel_url.path
        audit = self._audit.begin("kubernetes_api", request.method, path, request_id, request.remote or "")
        request[REQUEST_KEY] = audit
        response: web.StreamResponse | None = None
        try:
            with bind(request_id=request_id):
                tracer = tracing.TRACER
                if tracer is None:
                    response = await self._handle_bound(request, request_id, audit, ())
                else:
                    response = await self._handle_traced(tracer, request, request_id, audit)
            return response
        finally:
            audit.finish(response.status if response is not None else None)

    async def _handle_traced(
        self, tracer: Tracer, request: web.BaseRequest, request_id: str, audit: AuditRecord
    ) -> web.StreamResponse:
        """The request as a server span; a ``traceparent`` the client sent is its parent (issue 25 item 3)."""
        span = tracer.start(
            f"k8s_api_proxy {request.method}",
            "server",
            request.headers.items(),
            {
                "http.request.method": request.method,
                "url.path": request.rel_url.path[:512],
                "tether.request_id": request_id,
            },
        )
        try:
            response = await self._handle_bound(request, request_id, audit, span.carrier())
            span.http_status(response.status, server=True)
            return response
        except asyncio.CancelledError:
            # The client went away (kubectl closes as soon as it has the body): not a failure of kas.
            span.set("tether.client_gone", True)
            raise
        except BaseException as exc:
            span.fail(repr(exc))
            raise
        finally:
            span.end()

    async def _handle_bound(
        self, request: web.BaseRequest, request_id: str, audit: AuditRecord, trace: tuple[tuple[str, str], ...]
    ) -> web.StreamResponse:
        cors: dict[str, str] = {}
        try:
            cors = cors_headers(request.headers, self._external_url)
            if is_preflight(request.method, request.headers):
                audit.discard()
                return preflight_response(request.headers, cors)
            url_path = self._strip_prefix(request.rel_url.path)
            audit_target(audit, request.method, url_path, request.rel_url.query)
            auth, credentials = await self._authenticate(request, audit)
            impersonation = impersonation_for(auth, credentials.access_type)
            if self._usage is not None:
                self._usage.record(credentials.access_type, auth.user_id, credentials.agent_id)
            audit_identity(audit, auth, impersonation)
            if impersonation is not None and (name := carries_impersonation(request.headers.keys())):
                raise ProxyError(
                    403,
                    f"Forbidden: {NESTED_IMPERSONATION}: the request carries {name}, but agent "
                    f"{auth.agent_id} is reached as GitLab user {auth.username!r} (access_as: user)",
                )
            metadata = ((REQUEST_ID_METADATA, request_id), *trace)
            with bind(agent_id=credentials.agent_id):
                own = self._paths.get(url_path)
                if own is not None:
                    audit_session(audit, url_path.strip("/"))
                    return await own(request, credentials.agent_id, impersonation, metadata)
                upgrade = is_upgrade(request.headers.items())
                recorder = None
                if self._gitlab is not None:
                    recorder = session_recorder(self._config, auth, url_path, upgrade, audit.id, self._recording_budget)
                head = request_header(request, url_path, impersonation, trace)
                call = ProxyCall(request, head, upgrade, cors, tap=recorder)
                audit.counter = call
                try:
                    return await self._forward(request, call, credentials.agent_id, metadata)
                finally:
                    if recorder is not None and self._gitlab is not None:
                        # The session's connection is closed by now: storing holds up nothing of it. The event
                        # (finished by _handle after this) says whether the recording is whole.
                        timeout_s = self._config.session_recording_store_timeout
                        audit.recording = await audit_module.store_after_session(self._gitlab, recorder, timeout_s)
        except ProxyError as exc:
            log.debug("k8s proxy refused %s %s: %d %s", request.method, request.rel_url.path, exc.code, exc.message)
            return status_response(exc, cors)

    async def _authenticate(
        self, request: web.BaseRequest, audit: AuditRecord
    ) -> tuple[ProxyUserAuthorization, ProxyCredentials]:
        """Credentials and the hub's answer; a source with too many refusals gets 429 without a hub call.

        Credentials the hub has already accepted (a success in the authorizer's cache) skip the throttle: they
        cannot be a guess, and its Redis round trip was a tenth of kas' work on a small request (issue 28).
        """
        source = request.remote or "unknown"
        try:
            credentials = credentials_from(request.headers, request.rel_url.query, request.cookies)
        except ProxyError:
            await self._refuse_throttled(source)
            await self._count_refusal(source)
            raise
        audit_credentials(audit, credentials.agent_id, credentials.access_type)
        granted = self._authorizer.granted(credentials)
        if granted is not None:
            return granted, credentials
        await self._refuse_throttled(source)
        try:
            return await self._authorizer.authorize(credentials), credentials
        except ProxyError as exc:
            if exc.code == 401:
                await self._count_refusal(source)
            raise

    async def _refuse_throttled(self, source: str) -> None:
        """Raise 429 if ``source`` had more than the allowed refused credentials in the last minute."""
        if self._limiter is not None and not await self._limiter.allows(
            "proxy_auth_failures", self._failure_limit, source
        ):
            raise ProxyError(
                429,
                f"Too many requests: more than {self._failure_limit.amount} refused credentials per minute from "
                "this address; try again later",
                {"Retry-After": "60"},
            )

    async def _count_refusal(self, source: str) -> None:
        if self._limiter is not None:
            await self._limiter.hit("proxy_auth_failures", self._failure_limit, source)

    def _strip_prefix(self, path: str) -> str:
        if not path.startswith(self._prefix):
            raise ProxyError(400, f"Bad request: URL path {path[:200]!r} is not under {self._prefix!r}")
        return "/" + path[len(self._prefix) :]

    async def _call_agent(
        self, call: ProxyCall, agent_id: int, metadata: CallMetadata, timeout_s: float | None
    ) -> None:
        agent_call = self._agents.call(agent_id, MAKE_REQUEST, call.requests(), timeout_s=timeout_s, metadata=metadata)
        try:
            await call.relay(agent_call)
        finally:
            agent_call.cancel()

    async def _forward(
        self, request: web.BaseRequest, call: ProxyCall, agent_id: int, metadata: CallMetadata
    ) -> web.StreamResponse:
        watch = is_watch(request)
        route = asyncio.ensure_future(self._call_agent(call, agent_id, metadata, request_timeout_s(request)))
        if watch:
            self._watches.add(route)
        try:
            await route
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not (self._ending_watches and route.cancelled() and current is not None and not current.cancelling()):
                raise
            return await self._end_watch(call, "kas is shutting down")
        except AgentCallError as exc:
            if watch and call.head_sent:
                # A routing failure, or the path to the agent broke mid-watch (e.g. the gateway kas' tunnel ended
                # before its forwarded call at the end of its grace period): the client simply watches again.
                why = exc.message if exc.routing else f"the agent's answer failed: {exc.message}"
                return await self._end_watch(call, why)
            if not exc.routing:
                return self._fail(call, _agent_failure(exc))
            code = exc.http_code
            return self._fail(call, ProxyError(code, exc.message if code == 504 else f"Proxy error: {exc.message}"))
        except ResponseStreamError as exc:
            return self._fail(call, ProxyError(502, f"Proxy error: {exc}"))
        except ConnectionError as exc:
            log.debug("k8s proxy client went away: %r", exc)
            return self._fail(call, ProxyError(502, "Proxy error: the client connection failed"))
        finally:
            self._watches.discard(route)
            if call.raw is not None:
                call.raw.close()
        if not call.complete:
            if watch and call.head_sent:
                return await self._end_watch(call, "the agent ended the watch")
            return self._fail(call, ProxyError(502, "Proxy error: the agent ended the response early"))
        assert call.response is not None
        return call.response

    async def _end_watch(self, call: ProxyCall, why: str) -> web.StreamResponse:
        """End a watch with its terminating chunk: a client simply watches again (the API server does the same)."""
        if call.response is None or call.raw is not None:
            return self._fail(call, ProxyError(503, f"Service unavailable: {why}"))
        log.info("k8s proxy watch ended: %s", why)
        try:
            await call.response.write_eof()
        except ConnectionError:
            call.abort()
        return call.response

    @staticmethod
    def _fail(call: ProxyCall, error: ProxyError) -> web.StreamResponse:
        log.info("k8s proxy request failed: %d %s", error.code, error.message)
        if not call.head_sent or call.response is None:
            return status_response(error, call.extra_headers)
        # The head is out: the only way left to signal the failure is to cut the connection.
        log.info("k8s proxy response cut after its head: %s", error.message)
        call.abort()
        return call.response


def _agent_failure(error: AgentCallError) -> ProxyError:
    code = http_code(error.code)
    if code == 403:
        return ProxyError(403, f"Forbidden: {error.message}")
    return ProxyError(code, f"Proxy error: the agent could not make the request: {error.message}")
