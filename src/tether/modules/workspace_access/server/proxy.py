"""kas' workspaces listener: every request is checked in this order, and stops at the first answer.

1. The address (``addresses.py``): a host or path that names no workspace port kas serves gets 4xx, before
   anything else is looked at.
2. The sign-in callback answers itself (``sign_in.py``).
3. Credentials (``credentials.py``): none -> a browser is sent to sign in (302), anything else gets 401 with
   ``WWW-Authenticate: Bearer``; malformed ones get 401. A source with too many refused credentials gets 429.
   A session cookie on a request from another origin (its ``Origin`` header) gets 403: the zone's cookie goes
   with requests from every workspace of the zone, so another workspace's page must not act in its name.
4. The hub (``authorizer.py``): 401 for credentials it does not accept (a browser whose session ended signs in
   again), 403 when the caller does not own a workspace of that name (whether or not one exists).
5. The port must be one the workspace exposes (404, said only to its owner).
6. A workspace that is not running gets its state page (``pages.py``).
7. Everything else is forwarded (``forward.py``).

No request reaches the cluster before step 7, and none carries the user's credentials there.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import Counter

from tether.modserver.agent_conn import AgentConn
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.audit import AuditRecord, AuditSink
from tether.modules.workspace_access.server.addresses import AddressBook, AddressError, WorkspaceAddress
from tether.modules.workspace_access.server.audit import (
    UNAUDITED_OUTCOMES,
    audit_address,
    audit_credentials,
    audit_workspace,
)
from tether.modules.workspace_access.server.authorizer import AccessRefused, WorkspaceAuthorizer
from tether.modules.workspace_access.server.config import WorkspacesCF
from tether.modules.workspace_access.server.credentials import Credentials, CredentialsError, read_credentials
from tether.modules.workspace_access.server.forward import WorkspaceForwarder
from tether.modules.workspace_access.server.pages import WorkspaceStatePage, error_response, wants_html
from tether.modules.workspace_access.server.sign_in import SignIn
from tether.tool.http_grpc.headers import is_upgrade
from tether.tool.http_server import relay_server, start_site
from tether.tool.logs import REQUEST_ID_METADATA, bind, new_request_id
from tether.tool.rate_limit import RateLimiter, per_minute

__all__ = ["WorkspaceProxy"]

log = logging.getLogger(__name__)

REQUESTS = Counter(
    "tether_workspace_requests_total",
    "Requests to workspace addresses by how kas answered them",
    ["outcome"],
)
_RUNNING = "Running"
_BEARER_HINT = (
    "send 'Authorization: Bearer <personal access token with scope api or read_api>', or sign in with a browser"
)


class WorkspaceProxy:
    """The HTTP listener at ``workspaces.listen``.

    Args:
        config: the ``workspaces`` section.
        agents: calls the agents (``ServerApi.agent_conn``).
        tracker: connected agents.
        authorizer: the hub's answers, cached.
        sign_in: the browser sign-in steps.
        pages: the state pages.
        secret: the gitlab secret (session cookies are signed with it).
        limiter: failed-authentication limits shared through Redis, or None.
        audit: where requests for a workspace are recorded, refused ones too (``ServerApi.audit``; issue 25).
    """

    def __init__(
        self,
        config: WorkspacesCF,
        agents: AgentConn,
        tracker: AgentTracker,
        authorizer: WorkspaceAuthorizer,
        sign_in: SignIn,
        pages: WorkspaceStatePage,
        secret: bytes,
        limiter: RateLimiter | None = None,
        audit: AuditSink | None = None,
    ) -> None:
        self._config = config
        self._audit = audit if audit is not None else AuditSink()
        tls = config.listen.certificate_file is not None
        self._addresses = AddressBook(
            config.dns_zones, config.host_scheme or ("https" if tls else "http"), config.path_url
        )
        self._authorizer = authorizer
        self._sign_in = sign_in
        self._pages = pages
        self._secret = secret
        self._forwarder = WorkspaceForwarder(agents, tracker, config.agent_timeout, config.response_header_timeout)
        self._limiter = limiter if config.failed_auth_per_source_per_minute > 0 else None
        self._failure_limit = per_minute(max(config.failed_auth_per_source_per_minute, 1))
        server = relay_server(self._handle)
        self._runner = web.ServerRunner(server, shutdown_timeout=config.listen.shutdown_grace_period)

    async def start(self) -> int:
        """Bind and serve; return the bound TCP port (0 for a unix socket).

        Raises:
            OSError: the address cannot be bound.
            ssl.SSLError: the certificate or key cannot be loaded.
        """
        listen = self._config.listen
        return await start_site(self._runner, listen.network, listen.address, listen.certificate_file, listen.key_file)

    async def stop(self) -> None:
        """Stop accepting; in-flight requests get ``shutdown_grace_period``, then they are cut."""
        await self._runner.cleanup()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        request_id = new_request_id()
        audit = self._audit.begin("workspace", request.method, request.rel_url.path, request_id, request.remote or "")
        status: int | None = None
        try:
            with bind(request_id=request_id):
                response, outcome = await self._answer(request, request_id, audit)
            status = response.status
            if outcome in UNAUDITED_OUTCOMES:
                audit.discard()
        finally:
            audit.finish(status)
        REQUESTS.labels(outcome=outcome).inc()
        return response

    async def _answer(
        self, request: web.BaseRequest, request_id: str, audit: AuditRecord
    ) -> tuple[web.StreamResponse, str]:
        try:
            address = self._addresses.parse(request.headers.getall("Host", []), request.raw_path)
        except AddressError as exc:
            if exc.location is not None:
                return web.Response(status=exc.code, headers={"Location": exc.location}), "redirect"
            return error_response(request, exc.code, "Not a workspace address", exc.message), "bad_address"
        if address.callback:
            if request.method not in ("GET", "HEAD"):
                return error_response(request, 405, "Method not allowed", "the sign-in callback takes GET"), "sign_in"
            return self._sign_in.finish(request, address), "sign_in"
        audit_address(audit, address, is_upgrade(request.headers.items()))
        source = request.remote or "unknown"
        if self._limiter is not None and not await self._limiter.allows(
            "workspace_auth_failures", self._failure_limit, source
        ):
            message = (
                f"more than {self._failure_limit.amount} refused credentials per minute from this address; "
                "try again later"
            )
            return error_response(request, 429, "Too many requests", message, {"Retry-After": "60"}), "throttled"
        try:
            credentials, stale = read_credentials(request.headers, request.cookies, self._secret)
        except CredentialsError as exc:
            await self._refused(source)
            return self._unauthorized(request, str(exc)), "unauthorized"
        if credentials is None:
            if self._browser_navigation(request):
                return self._sign_in.start(address, stale), "sign_in"
            return self._unauthorized(request, f"no credentials: {_BEARER_HINT}"), "unauthorized"
        audit_credentials(audit, credentials)
        if credentials.from_cookie and not _same_origin(request, address):
            # The zone's cookie goes with requests from any page of the zone: another workspace's page must not
            # reach this one in its user's name (cross-site WebSocket hijacking, CSRF).
            message = "a request from another origin may not use the workspace session; open the workspace itself"
            return error_response(request, 403, "Forbidden", message), "cross_origin"
        return await self._authorized(request, request_id, address, credentials, source, audit)

    async def _authorized(
        self,
        request: web.BaseRequest,
        request_id: str,
        address: WorkspaceAddress,
        credentials: Credentials,
        source: str,
        audit: AuditRecord,
    ) -> tuple[web.StreamResponse, str]:
        try:
            ws = await self._authorizer.authorize(address.name, address.zone, credentials)
        except AccessRefused as exc:
            if exc.code == 401:
                await self._refused(source)
                if credentials.from_cookie and self._browser_navigation(request):
                    return self._sign_in.start(address, stale_cookie=True), "sign_in"
                return self._unauthorized(request, exc.message), "unauthorized"
            if exc.code == 403:
                return error_response(request, 403, "Forbidden", exc.message), "forbidden"
            return error_response(request, exc.code, "Bad gateway", exc.message), "hub_failed"
        audit_workspace(audit, ws)
        with bind(agent_id=ws.agent_id):
            if address.port not in ws.ports:
                exposed = ", ".join(str(port) for port in ws.ports) or "none"
                message = f"workspace {ws.name} does not expose port {address.port}; its ports: {exposed}"
                return error_response(request, 404, "No such port", message), "no_port"
            if ws.actual_state != _RUNNING:
                return self._pages.answer(request, ws), "not_running"
            metadata = ((REQUEST_ID_METADATA, request_id),)
            return await self._forwarder.forward(request, address, ws, metadata, audit), "forwarded"

    async def _refused(self, source: str) -> None:
        if self._limiter is not None:
            await self._limiter.hit("workspace_auth_failures", self._failure_limit, source)

    @staticmethod
    def _browser_navigation(request: web.BaseRequest) -> bool:
        # Only a page load can follow a redirect to the hub and come back; XHR, WebSocket and tools get 401.
        return request.method in ("GET", "HEAD") and wants_html(request) and not is_upgrade(request.headers.items())

    @staticmethod
    def _unauthorized(request: web.BaseRequest, message: str) -> web.Response:
        headers = {"WWW-Authenticate": 'Bearer realm="tether-workspaces"'}
        return error_response(request, 401, "Unauthorized", message, headers)


def _same_origin(request: web.BaseRequest, address: WorkspaceAddress) -> bool:
    """No ``Origin`` (a page load, a tool), or exactly the address' own origin."""
    origins = request.headers.getall("Origin", [])
    return not origins or (len(origins) == 1 and origins[0].strip().lower() == address.origin)
