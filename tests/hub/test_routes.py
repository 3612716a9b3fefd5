"""The internal API is matched first (issue 28), which is only safe while no public route can match its paths."""

from __future__ import annotations

import re

from fastapi import APIRouter
from fastapi.routing import APIRoute

from tether.hub.app import INTERNAL_ROUTERS, PUBLIC_ROUTERS


def _paths(routers: tuple[APIRouter, ...]) -> list[str]:
    return [route.path for router in routers for route in router.routes if isinstance(route, APIRoute)]


def test_every_internal_route_is_under_internal() -> None:
    paths = _paths(INTERNAL_ROUTERS)
    assert paths
    assert [p for p in paths if not p.startswith("/internal/")] == []


def test_no_public_route_can_match_an_internal_path() -> None:
    # A first segment that is a parameter ("/{id}/...") could match "internal"; a literal one must differ.
    paths = _paths(PUBLIC_ROUTERS)
    assert paths
    first = {p: p.split("/")[1] for p in paths}
    assert {p: s for p, s in first.items() if s == "internal" or re.fullmatch(r"\{.*\}", s)} == {}
