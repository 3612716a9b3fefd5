"""Errors of the Kubernetes API proxy as Kubernetes ``metav1.Status`` JSON (kas.md §5.3 step 7).

kubectl and client-go print the ``message`` of a ``Status`` body, so every refusal kas makes itself
says what went wrong in the client's own words: ``GitLab Agent Server: <what>: <detail>``. ``reason`` is
the one apimachinery derives from the HTTP code; codes it has no reason for (e.g. 502) leave it out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

__all__ = ["MESSAGE_PREFIX", "UNAUTHORIZED_HEADER", "ProxyError", "status_body", "status_response"]

MESSAGE_PREFIX = "GitLab Agent Server: "
#: Set on 401 answers caused by kas' own authentication, so clients can tell them from the cluster's 401s.
UNAUTHORIZED_HEADER = "Gitlab-Unauthorized"

#: HTTP code -> ``metav1.StatusReason`` (apimachinery ``errors.go`` reason table).
_REASONS: Mapping[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ProxyError(Exception):
    """A request kas refuses or cannot serve, answered with a ``Status`` body.

    Args:
        code: HTTP status code, e.g. 401.
        message: what went wrong, without the ``GitLab Agent Server:`` prefix.
        headers: extra response headers (e.g. ``Gitlab-Unauthorized: true``).
    """

    def __init__(self, code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def status_body(code: int, message: str) -> dict[str, Any]:
    """The ``Status`` object for ``code`` with ``message`` prefixed by ``GitLab Agent Server:``."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": MESSAGE_PREFIX + message,
    }
    reason = _REASONS.get(code)
    if reason is not None:
        body["reason"] = reason
    body["code"] = code
    return body


def status_response(error: ProxyError, extra_headers: Mapping[str, str] | None = None) -> web.Response:
    """An ``application/json`` response carrying the ``Status`` of ``error`` with its HTTP code."""
    headers = {**(extra_headers or {}), **error.headers}
    return web.Response(
        status=error.code,
        body=json.dumps(status_body(error.code, error.message)).encode(),
        content_type="application/json",
        headers=headers,
    )
