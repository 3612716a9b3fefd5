"""The hub's ASGI application.

REST API under ``/api/v4``, internal API under ``/api/v4/internal``, browser sign-in under ``/users/`` (sign_in,
session, sign_out), OpenAPI at ``/openapi.json`` (interactive docs at ``/docs``), health at ``/-/health``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tether import __version__
from tether.hub.api import errors, security_headers
from tether.hub.api.access_log import AccessLogMiddleware
from tether.hub.api.encoded_paths import EncodedPathMiddleware
from tether.hub.api.form_bodies import FormBodyMiddleware
from tether.hub.api.graphql import router as graphql_router
from tether.hub.api.internal_auth import KasJwtMiddleware
from tether.hub.api.routes_agent_config import router as agent_config_router
from tether.hub.api.routes_agent_tokens import router as agent_tokens_router
from tether.hub.api.routes_agents import router as agents_router
from tether.hub.api.routes_audit import router as audit_router
from tether.hub.api.routes_audit_internal import router as audit_internal_router
from tether.hub.api.routes_audit_recordings import internal_router as audit_recordings_internal_router
from tether.hub.api.routes_audit_recordings import router as audit_recordings_router
from tether.hub.api.routes_gitlab_compat import router as gitlab_compat_router
from tether.hub.api.routes_groups import router as groups_router
from tether.hub.api.routes_internal import router as internal_router
from tether.hub.api.routes_internal_upstream import router as internal_upstream_router
from tether.hub.api.routes_members import router as members_router
from tether.hub.api.routes_projects import router as projects_router
from tether.hub.api.routes_sessions import router as sessions_router
from tether.hub.api.routes_users import router as users_router
from tether.hub.api.routes_workspace_sign_in import router as workspace_sign_in_router
from tether.hub.api.routes_workspaces_internal import router as workspaces_internal_router
from tether.hub.api.state import HubState
from tether.hub.api.throttle import FailedAuthThrottle
from tether.hub.config import HubConfig
from tether.hub.console import routes as console
from tether.hub.db.engine import Database
from tether.hub.db.migrate import ensure_current
from tether.hub.gitaly import GitalyServer
from tether.hub.kas_client import client_for
from tether.hub.secrets_file import gitaly_token
from tether.hub.service.audit_retention import RetentionSweeper
from tether.hub.service.revocation_outbox import RevocationSweeper
from tether.hub.service.token_use import TokenUseWriter

log = logging.getLogger(__name__)

#: The internal API kas calls, under ``/api/v4/internal/``, included first: FastAPI tries routes in order and kas
#: calls it for every agent that connects. Included last, each call was matched against every public route first,
#: 64 % of the hub's time on an ``agent_info`` (issue 28). The order cannot change which route answers while no
#: public path can match an internal one (``tests/hub/test_routes.py``).
INTERNAL_ROUTERS = (
    audit_internal_router,  # before internal_router: its catch-all would answer 404
    audit_recordings_internal_router,  # before internal_router too
    workspaces_internal_router,  # before internal_router: its catch-all would answer 404
    internal_upstream_router,  # before internal_router, whose catch-all answers unknown internal paths
    internal_router,
)
#: The GitLab-shaped public API under ``/api/v4``.
PUBLIC_ROUTERS = (
    users_router,
    groups_router,
    projects_router,
    members_router,
    agents_router,
    agent_tokens_router,
    agent_config_router,
    audit_router,
    audit_recordings_router,
    gitlab_compat_router,
)


def create_app(config: HubConfig, gitlab_secret: bytes) -> FastAPI:
    """Build the application; the database and the kas client are opened by its lifespan.

    Args:
        config: the hub configuration.
        gitlab_secret: the internal API JWT secret (32 bytes), loaded by the caller so errors show before binding.

    The lifespan migrates the database when ``database.auto_migrate`` (else checks it is current) and raises
    :class:`~tether.hub.db.migrate.SchemaNotCurrent`, :class:`~tether.tool.secrets.SecretError` or
    SQLAlchemy errors when it cannot start.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(config.database_url)
        kas = None
        gitaly = None
        token_uses = TokenUseWriter(db)
        sweeper = None
        audit_sweeper = RetentionSweeper(db, config.audit.retention_days)
        try:
            await ensure_current(db.engine, config.database.auto_migrate)
            audit_sweeper.start()
            kas = client_for(config)
            if kas is not None:
                sweeper = RevocationSweeper(db, kas, config.kas.timeout)
                sweeper.start()
            token = ""
            if config.gitaly.listen is not None:
                token = gitaly_token(config)
                gitaly = GitalyServer(db, token, config.gitaly.listen)
                await gitaly.start()
            app.state.hub = HubState(
                config=config,
                db=db,
                gitlab_secret=gitlab_secret,
                kas=kas,
                throttle=FailedAuthThrottle(db, config.security.failed_auth_per_source_per_minute),
                token_uses=token_uses,
                gitaly_token=token,
                revocations=sweeper,
            )
            log.info("hub ready on %s (database: %s)", config.listen, db.backend)
            yield
        finally:
            await audit_sweeper.close()
            if sweeper is not None:
                await sweeper.close()
            await token_uses.close()
            if gitaly is not None:
                await gitaly.stop()
            if kas is not None:
                await kas.close()
            await db.close()

    app = FastAPI(
        title="Tether hub",
        version=__version__,
        description="The control plane of Tether: a GitLab-shaped REST API (/api/v4) and the internal API kas calls.",
        lifespan=lifespan,
    )
    errors.install(app)
    api = APIRouter(prefix="/api/v4")
    for router in (*INTERNAL_ROUTERS, *PUBLIC_ROUTERS):
        api.include_router(router)

    @api.get("/version", tags=["meta"], summary="Version")
    async def version() -> dict[str, str]:
        """The hub's version (GitLab clients call this to probe the server)."""
        return {"version": __version__, "revision": "tether"}

    app.include_router(api)
    app.include_router(graphql_router())
    app.include_router(sessions_router)
    app.include_router(workspace_sign_in_router)
    console.install(app)

    @app.get("/-/health", tags=["meta"], summary="Liveness")
    async def health() -> dict[str, str]:
        """200 while the process serves requests."""
        return {"status": "ok"}

    @app.get("/-/metrics", tags=["meta"], summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Process metrics, e.g. ``tether_rate_limited_total{limit="hub_auth_failures"}`` (counts only)."""
        return PlainTextResponse(generate_latest(REGISTRY).decode(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(FormBodyMiddleware)
    app.add_middleware(KasJwtMiddleware)
    app.add_middleware(EncodedPathMiddleware)
    app.add_middleware(AccessLogMiddleware)
    security_headers.install(app)  # last added, outermost: it completes every answer, 401/404/413 too
    return app
