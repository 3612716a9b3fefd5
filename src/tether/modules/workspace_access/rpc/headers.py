"""Header rules of workspace requests: the user's credentials never reach the workspace, nor can it set them.

Requests: hop-by-hop headers go (``kubernetes_api.rpc.headers.clean_headers``), and so do ``Authorization``,
``Proxy-Authorization`` and kas' own cookies inside ``Cookie``; the workspace's own cookies stay. The original
``Host`` is kept (editors check ``Origin`` against it), and ``X-Forwarded-Host``/``-Proto``/``-For`` plus, in the
path form, ``X-Forwarded-Prefix`` tell the workspace where it is served.

Responses: a ``Set-Cookie`` for one of kas' cookies is dropped (a workspace must not sign its user in as someone
else, or out); in the path form a ``Location`` on the same origin gets the workspace's path prefix back.
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.modules.kubernetes_api.rpc.headers import HeaderMap, clean_headers, via_value
from tether.modules.workspace_access import SESSION_COOKIE, STATE_COOKIE

__all__ = ["KAS_COOKIES", "request_headers", "response_headers", "without_kas_cookies"]

#: Cookies that belong to kas and never reach a workspace.
KAS_COOKIES = frozenset({SESSION_COOKIE, STATE_COOKIE})
#: The caller's credentials for kas.
_CREDENTIALS = ("Authorization", "Proxy-Authorization")
#: Set by kas from what it saw; a client's own values would lie to the workspace.
_FORWARDED = ("X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Prefix", "Forwarded")


def without_kas_cookies(values: Iterable[str]) -> list[str]:
    """The ``Cookie`` header values without kas' cookies; values left empty are dropped.

    Args:
        values: each ``Cookie`` header's value, e.g. ``"a=1; _tether_workspaces=ey...; b=2"``.
    """
    kept = []
    for value in values:
        pairs = [pair.strip() for pair in value.split(";")]
        pairs = [pair for pair in pairs if pair and pair.split("=", 1)[0].strip() not in KAS_COOKIES]
        if pairs:
            kept.append("; ".join(pairs))
    return kept


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
    headers = clean_headers(listed, drop=(*_CREDENTIALS, *_FORWARDED, "Cookie"))
    cookies = without_kas_cookies(value for key, value in listed if key.lower() == "cookie")
    if cookies:
        headers["Cookie"] = ["; ".join(cookies)]
    headers["Host"] = [host]
    headers["X-Forwarded-Host"] = [host]
    headers["X-Forwarded-Proto"] = [scheme]
    if remote:
        headers["X-Forwarded-For"] = [", ".join([*headers.get("X-Forwarded-For", []), remote])]
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
        kept = [v for v in result["Set-Cookie"] if v.split("=", 1)[0].strip() not in KAS_COOKIES]
        if kept:
            result["Set-Cookie"] = kept
        else:
            del result["Set-Cookie"]
    if prefix is not None and "Location" in result:
        result["Location"] = [
            prefix + value if value.startswith("/") and not value.startswith("//") else value
            for value in result["Location"]
        ]
    return result
