"""What the browser-facing pages need: the session cookies, a same-origin check and form bodies.

Cookies (both ``HttpOnly``, ``SameSite=Lax``, ``Max-Age`` = ``sessions.lifetime``, ``Secure`` when
``external_url`` is ``https://``), each scoped as narrowly as its reader allows (issue 27 item 2):

* ``_gitlab_session``: the session id, for the hub itself: host-only, path ``/`` (every page, the API, the
  workspaces sign-in);
* ``_gitlab_kas``: the same id URL-escaped, for kas' Kubernetes API proxy (kas.md §4.5): path of
  ``kas.k8s_proxy_url`` (``/k8s-proxy/``; ``/`` when unknown), so that a browser does not send it to other
  paths of the same host (kas' workspaces listener under ``tether up``); host-only, or with
  ``sessions.kas_cookie_domain`` as its ``Domain`` when kas is on another host of the same site.

Cookies ignore ports, and a ``Domain`` covers every host below it: whatever else listens on the hub's host, or
in a zone the kas cookie's domain covers, receives them from browsers. kas' workspaces listener never passes
them on (``workspace_access.rpc.headers``); docs/workspaces.md lists the safe deployments.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from fastapi import Request, Response

from tether.hub import session_tokens
from tether.hub.config import HubConfig
from tether.hub.errors import BadRequest, Forbidden

SESSION_COOKIE = "_gitlab_session"
KAS_COOKIE = "_gitlab_kas"
CSRF_HEADER = "X-Csrf-Token"
#: The sign-out form's CSRF field (Rails' name).
CSRF_FIELD = "authenticity_token"
#: The sign-in form's field (and ``GET /users/sign_in`` parameter) naming where to go once signed in.
REDIRECT_FIELD = "redirect_to"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
_MAX_FORM_BYTES = 16 * 1024


def kas_cookie_path(config: HubConfig) -> str:
    """``Path`` of the ``_gitlab_kas`` cookie: the path of ``kas.k8s_proxy_url``, or ``/`` when it is not set."""
    url = config.kas.k8s_proxy_url
    path = urlsplit(url).path if url else ""
    return path if path.startswith("/") else "/"


def set_session_cookies(response: Response, session_id: str, config: HubConfig) -> None:
    """Add ``Set-Cookie`` for ``_gitlab_session`` and ``_gitlab_kas`` carrying ``session_id`` (module docstring)."""
    max_age = max(1, int(config.sessions.lifetime))
    secure = config.secure_cookies
    response.set_cookie(SESSION_COOKIE, session_id, max_age=max_age, secure=secure, httponly=True, samesite="lax")
    response.set_cookie(
        KAS_COOKIE,
        session_tokens.kas_cookie_value(session_id),
        max_age=max_age,
        path=kas_cookie_path(config),
        domain=config.sessions.kas_cookie_domain,
        secure=secure,
        httponly=True,
        samesite="lax",
    )


def clear_session_cookies(response: Response, config: HubConfig) -> None:
    """Add ``Set-Cookie`` headers that make the browser drop both session cookies."""
    secure = config.secure_cookies
    response.delete_cookie(SESSION_COOKIE, secure=secure, httponly=True, samesite="lax")
    # Before issue 27 the kas cookie had Path=/: a browser signed in then still holds it there.
    for path in dict.fromkeys(("/", kas_cookie_path(config))):
        response.delete_cookie(
            KAS_COOKIE,
            path=path,
            domain=config.sessions.kas_cookie_domain,
            secure=secure,
            httponly=True,
            samesite="lax",
        )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_same_origin(request: Request, config: HubConfig) -> None:
    """Refuse a form post that a page of another origin made the browser send.

    Browsers send ``Origin`` with cross-origin POSTs; it must then be ``external_url``'s origin or the request's
    own host (either scheme). Requests without ``Origin`` (scripts, curl) pass.

    Raises:
        Forbidden: ``Origin`` names another site, or is ``null``.
    """
    origin = request.headers.get("origin")
    if origin is None:
        return
    allowed = {_origin(config.base_url)}
    host = request.headers.get("host")
    if host:
        allowed |= {f"http://{host}".lower(), f"https://{host}".lower()}
    if origin.strip().lower() not in allowed:
        raise Forbidden("403 Forbidden - the form was posted from another origin")


def is_form(request: Request) -> bool:
    """Whether the request body is ``application/x-www-form-urlencoded``."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower() == FORM_CONTENT_TYPE


async def read_form(request: Request, max_bytes: int = _MAX_FORM_BYTES) -> dict[str, str]:
    """The fields of a form-encoded body (at most ``max_bytes``, 16 KiB by default).

    A repeated field keeps its last value.

    Raises:
        BadRequest: another content type, or a body over the limit.
    """
    if not is_form(request):
        raise BadRequest(f"400 Bad request - send the form as {FORM_CONTENT_TYPE}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise BadRequest(f"400 Bad request - the form is larger than {max_bytes // 1024} KiB")
    return dict(parse_qsl(body.decode(errors="replace"), keep_blank_values=True))


def local_redirect(value: str | None) -> str:
    """``value`` when it is a path on this hub (``/...``, not ``//host`` nor any backslash), else ``""``.

    Only such paths may follow a sign-in: anything else would make the hub an open redirect.
    """
    if not value or len(value) > 4096 or not value.startswith("/") or value[1:2] in ("/", "\\"):
        return ""
    if not value.isprintable() or "\\" in value:
        return ""
    return value
