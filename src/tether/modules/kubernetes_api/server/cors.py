"""CORS for browsers calling the Kubernetes API proxy from the GitLab UI (kas.md §4.5 "CORS").

Only checked when ``gitlab.external_url`` is configured: a request with an ``Origin`` must come from exactly
that origin (403 otherwise), and the answer then allows it with credentials. A preflight (``OPTIONS`` with
``Origin`` and ``Access-Control-Request-Method``) is answered by kas itself.
"""

from __future__ import annotations

from aiohttp import web
from multidict import MultiMapping

from tether.modules.kubernetes_api.server.status import ProxyError

__all__ = ["ALLOWED_METHODS", "cors_headers", "is_preflight", "preflight_response"]

ALLOWED_METHODS = "GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH"
#: One day, in seconds: how long a browser may reuse a preflight answer.
PREFLIGHT_MAX_AGE_S = 86400


def cors_headers(headers: MultiMapping[str], external_url: str | None) -> dict[str, str]:
    """Response headers that allow the request's origin; empty when CORS does not apply.

    Args:
        headers: the request headers.
        external_url: ``gitlab.external_url``, e.g. ``https://gitlab.example.com`` (a trailing ``/`` is
            ignored), or None when not configured.

    Raises:
        ProxyError: 403 when ``Origin`` is present and is not ``external_url``.
    """
    origin = headers.get("Origin")
    if origin is None or external_url is None:
        return {}
    if origin != external_url.rstrip("/"):
        raise ProxyError(403, f"Forbidden: origin {origin[:200]!r} is not allowed, only {external_url.rstrip('/')!r}")
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}


def is_preflight(method: str, headers: MultiMapping[str]) -> bool:
    """Whether the request is a CORS preflight."""
    return method == "OPTIONS" and "Origin" in headers and "Access-Control-Request-Method" in headers


def preflight_response(headers: MultiMapping[str], allowed: dict[str, str]) -> web.Response:
    """200 answer to a preflight: echo the requested headers, list every method, cache for a day.

    Args:
        headers: the preflight's request headers.
        allowed: the headers :func:`cors_headers` returned for it.
    """
    answer = dict(allowed)
    answer["Access-Control-Allow-Headers"] = ", ".join(headers.getall("Access-Control-Request-Headers", []))
    answer["Access-Control-Allow-Methods"] = ALLOWED_METHODS
    answer["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
    return web.Response(status=200, headers=answer)
