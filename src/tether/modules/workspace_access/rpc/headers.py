"""Header rules of workspace requests: no credential of Tether's reaches a workspace, nor can it set one.

Requests (issue 27 item 2): a workspace receives only the headers of an allow-list, checked by kas and again
by agentk. Allowed are the standard headers browsers and HTTP tools send (:data:`STANDARD_REQUEST_HEADERS`:
content negotiation, caching, ranges, ``Origin``/``Referer``, fetch metadata, WebSocket handshakes...), and
application headers named ``X-*`` or ``Sec-*`` (a workspace's own scripts and tools send them: Jupyter's
``X-XSRFToken``, ``X-Requested-With``), except the names of Tether's and GitLab's credentials and of what kas
sets itself (:data:`RESERVED_HEADERS`). So ``Authorization``, ``Proxy-Authorization``, ``Private-Token``,
``Job-Token``, ``Gitlab-*`` and every header a browser would attach on its own besides ``Cookie`` are never
forwarded. ``Cookie`` keeps only the workspace's cookies: names in Tether's namespaces ``_gitlab*`` and
``_tether*`` (with or without a ``__Host-``/``__Secure-`` prefix) never pass: the hub's ``_gitlab_session``
and ``_gitlab_kas`` reach kas whenever the workspaces share the hub's host (``tether up``: cookies ignore
ports) or ``sessions.kas_cookie_domain`` covers the zone, and with them a workspace acted as its owner. A
cookie's name is all the ``Cookie`` header says about it, so its namespace is what kas can check.

The original ``Host`` is kept (editors check ``Origin`` against it), and ``X-Forwarded-Host``/``-Proto``/
``-For`` plus, in the path form, ``X-Forwarded-Prefix`` tell the workspace where it is served.

Responses: a ``Set-Cookie`` naming a cookie of Tether's namespaces is dropped (a workspace must not sign its
user in as someone else, or out, nor plant a hub cookie); in the path form a ``Location`` on the same origin
gets the workspace's path prefix back (unless it already starts with it).
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.tool.http_grpc.headers import HeaderMap, clean_headers, via_value

__all__ = [
    "KAS_SET_HEADERS",
    "RESERVED_HEADERS",
    "STANDARD_REQUEST_HEADERS",
    "is_tether_cookie",
    "request_headers",
    "response_headers",
    "workspace_cookies",
    "workspace_request_headers",
]

#: Standard request headers a workspace receives as sent (RFC 9110, 9111, 6455, Fetch, client hints), lower case.
STANDARD_REQUEST_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "access-control-request-headers",
        "access-control-request-method",
        "baggage",
        "cache-control",
        "connection",
        "content-digest",
        "content-encoding",
        "content-language",
        "content-length",
        "content-range",
        "content-type",
        "cookie",
        "date",
        "device-memory",
        "dnt",
        "downlink",
        "dpr",
        "ect",
        "expect",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "idempotency-key",
        "last-event-id",
        "origin",
        "pragma",
        "prefer",
        "priority",
        "purpose",
        "range",
        "referer",
        "repr-digest",
        "rtt",
        "save-data",
        "te",
        "traceparent",
        "tracestate",
        "upgrade",
        "upgrade-insecure-requests",
        "user-agent",
        "viewport-width",
        "want-content-digest",
        "want-repr-digest",
        "width",
    }
)
#: Application header prefixes a workspace receives (lower case).
_APPLICATION_PREFIXES = ("x-", "sec-")
#: Application headers that never pass: credentials of Tether and GitLab, and what kas sets itself.
RESERVED_HEADERS = frozenset(
    {
        "x-csrf-token",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-prefix",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-real-ip",
        "x-request-id",
    }
)
_RESERVED_PREFIXES = ("x-gitlab", "x-tether")
#: What kas sets on each workspace request (agentk passes them on).
KAS_SET_HEADERS = ("X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-For", "X-Forwarded-Prefix", "Via")
#: Cookie namespaces of Tether, and of GitLab whose cookie names the hub keeps (lower case).
_TETHER_COOKIE_PREFIXES = ("_gitlab", "_tether")
_COOKIE_NAME_PREFIXES = ("__host-", "__secure-")


def _allowed(name: str) -> bool:
    lower = name.lower()
    if lower in STANDARD_REQUEST_HEADERS:
        return True
    return (
        lower.startswith(_APPLICATION_PREFIXES)
        and lower not in RESERVED_HEADERS
        and not (lower.startswith(_RESERVED_PREFIXES))
    )


def is_tether_cookie(name: str) -> bool:
    """Whether a cookie name is in Tether's namespaces (``_gitlab*``, ``_tether*``, also behind ``__Host-``)."""
    lower = name.strip().lower()
    for prefix in _COOKIE_NAME_PREFIXES:
        lower = lower.removeprefix(prefix)
    return lower.startswith(_TETHER_COOKIE_PREFIXES)


def workspace_cookies(values: Iterable[str]) -> list[str]:
    """The ``Cookie`` header values without Tether's cookies; values left empty are dropped.

    Args:
        values: each ``Cookie`` header's value, e.g. ``"a=1; _gitlab_session=...; b=2"``.
    """
    kept = []
    for value in values:
        pairs = [pair.strip() for pair in value.split(";")]
        pairs = [pair for pair in pairs if pair and not is_tether_cookie(pair.split("=", 1)[0])]
        if pairs:
            kept.append("; ".join(pairs))
    return kept


def workspace_request_headers(pairs: Iterable[tuple[str, str]], keep: Iterable[str] = ()) -> HeaderMap:
    """The headers a workspace may receive, without ``Host`` (allow-list and cookies: module docstring).

    Args:
        pairs: the headers as received.
        keep: further names to keep: agentk keeps what kas set (``X-Forwarded-*``, ``Via``).
    """
    listed = list(pairs)
    kept = {name.lower() for name in keep}
    dropped = {key for key, _ in listed if not _allowed(key) and key.lower() not in kept} | {"Cookie"}
    headers = clean_headers(listed, drop=dropped)
    cookies = workspace_cookies(value for key, value in listed if key.lower() == "cookie")
    if cookies:
        headers["Cookie"] = ["; ".join(cookies)]
    return headers


def request_headers(
    pairs: Iterable[tuple[str, str]], host: str, scheme: str, remote: str | None, prefix: str | None
) -> HeaderMap:
    """The headers a workspace receives for a request.

    Args:
        pairs: the client's headers as received.
        host: the client's ``Host`` (already checked), e.g. ``60001-ws.workspaces.example.com``.
        scheme: ``http`` or ``https``, as the user reached kas.
        remote: the client's address, appended to ``X-Forwarded-For``; None when unknown.
        prefix: in the path form, the prefix kas removed (``/-/workspaces/ws/60001``); None in the host form.
    """
    listed = list(pairs)
    forwarded_for = [value for key, value in listed if key.lower() == "x-forwarded-for"]
    headers = workspace_request_headers(listed)
    headers["Host"] = [host]
    headers["X-Forwarded-Host"] = [host]
    headers["X-Forwarded-Proto"] = [scheme]
    if remote:
        headers["X-Forwarded-For"] = [", ".join([*forwarded_for, remote])]
    if prefix is not None:
        headers["X-Forwarded-Prefix"] = [prefix]
    headers.setdefault("Via", []).append(via_value("gRPC/1.0", "gitlab-kas"))
    return headers


def response_headers(headers: HeaderMap, prefix: str | None) -> HeaderMap:
    """The workspace's response headers as the client receives them.

    Args:
        headers: the response headers (canonical names), hop-by-hop headers already removed.
        prefix: in the path form, the workspace's prefix (``/-/workspaces/ws/60001``); None in the host form.
    """
    result = dict(headers)
    if "Set-Cookie" in result:
        kept = [v for v in result["Set-Cookie"] if not is_tether_cookie(v.split("=", 1)[0])]
        if kept:
            result["Set-Cookie"] = kept
        else:
            del result["Set-Cookie"]
    if prefix is not None and "Location" in result:
        result["Location"] = [_prefixed(value, prefix) for value in result["Location"]]
    return result


def _prefixed(location: str, prefix: str) -> str:
    """A same-origin absolute path gets the prefix back, unless it names it already.

    An editor told its public base path (the injected editor's ``GL_EDITOR_BASE_PATH``) redirects within it;
    one that knows nothing of kas redirects to its own root.
    """
    if not location.startswith("/") or location.startswith("//"):
        return location
    if location == prefix or location.startswith((prefix + "/", prefix + "?")):
        return location
    return prefix + location
