"""The internal API is matched first (issue 28), which is only safe while no public route can match its paths."""

from __future__ import annotations

import re

from fastapi import APIRouter
from fastapi.routing import APIRoute

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
from tether.hub.api.routes_users import router as users_router
from tether.hub.api.routes_workspaces_internal import router as workspaces_internal_router

INTERNAL = (
    audit_internal_router,
    audit_recordings_internal_router,
    workspaces_internal_router,
    internal_upstream_router,
    internal_router,
)
PUBLIC = (
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


def _paths(routers: tuple[APIRouter, ...]) -> list[str]:
    return [route.path for router in routers for route in router.routes if isinstance(route, APIRoute)]


def test_every_internal_route_is_under_internal() -> None:
    paths = _paths(INTERNAL)
    assert paths
    assert [p for p in paths if not p.startswith("/internal/")] == []


def test_no_public_route_can_match_an_internal_path() -> None:
    # A first segment that is a parameter ("/{id}/...") could match "internal"; a literal one must differ.
    paths = _paths(PUBLIC)
    assert paths
    first = {p: p.split("/")[1] for p in paths}
    assert {p: s for p, s in first.items() if s == "internal" or re.fullmatch(r"\{.*\}", s)} == {}
