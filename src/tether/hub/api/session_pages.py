"""The HTML of the sign-in pages: plain forms, no scripts, every value escaped.

Links and form actions are relative (``sign_in``, ``sign_out``, ``session``), so the pages work under
``/users/`` whatever path prefix a reverse proxy adds.
"""

from __future__ import annotations

from datetime import datetime
from html import escape

from fastapi.responses import HTMLResponse

from tether.hub.api.browser import CSRF_FIELD, CSRF_HEADER, KAS_COOKIE, REDIRECT_FIELD, SESSION_COOKIE

#: Pages show a CSRF token or take a token: never cached, never framed, nothing loaded from anywhere.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}
_STYLE = (
    "body{font-family:sans-serif;max-width:42em;margin:3em auto;padding:0 1em}label{display:block;margin:1em 0}"
    "input{display:block;width:100%}pre{background:#eee;padding:.5em;overflow-wrap:anywhere;white-space:pre-wrap}"
    ".error{color:#a00}.notice{color:#060}"
)


def _document(title: str, body: str, head: str = "") -> str:
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · Tether hub</title>'
        f"{head}<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def page(html: str, status_code: int = 200) -> HTMLResponse:
    """An HTML response with :data:`PAGE_HEADERS`."""
    return HTMLResponse(html, status_code=status_code, headers=PAGE_HEADERS)


def sign_in_form(error: str | None = None, notice: str | None = None, login: str = "", redirect_to: str = "") -> str:
    """The sign-in form (fields ``login`` and ``token``), with an optional error or notice above it.

    Args:
        error: shown in red, e.g. ``Invalid login or token.``.
        notice: shown in green when there is no error.
        login: the username to fill in again.
        redirect_to: a local path to go to after signing in (a hidden field), or empty.
    """
    message = ""
    if error:
        message = f'<p class="error" role="alert">{escape(error)}</p>'
    elif notice:
        message = f'<p class="notice">{escape(notice)}</p>'
    hidden = f'<input type="hidden" name="{REDIRECT_FIELD}" value="{escape(redirect_to)}">\n' if redirect_to else ""
    body = f"""<h1>Sign in to the Tether hub</h1>
{message}
<form method="post" action="sign_in">
{hidden}<label>Username <input name="login" value="{escape(login)}" autocomplete="username" required autofocus></label>
<label>Personal access token <input name="token" type="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form>
<p>The hub has no passwords: sign in with one of your personal access tokens that has scope <code>api</code> or
<code>k8s_proxy</code>. Signing in lets this browser use the Kubernetes API proxy of kas.</p>"""
    return _document("Sign in", body)


def signed_in(username: str, csrf_token: str, expires_at: datetime) -> str:
    """The page after sign-in: who, until when, the CSRF token and a sign-out button."""
    token = escape(csrf_token)
    body = f"""<h1>Signed in as {escape(username)}</h1>
<p>This browser holds the session cookies <code>{SESSION_COOKIE}</code> (for this hub) and <code>{KAS_COOKIE}</code>
(for kas' Kubernetes API proxy). The session expires at {escape(expires_at.strftime("%Y-%m-%d %H:%M:%S UTC"))}.</p>
<p>Send this CSRF token with every request to the Kubernetes API proxy, in the <code>{CSRF_HEADER}</code> header or
the <code>gitlab-csrf-token</code> query parameter, with the agent id in <code>Gitlab-Agent-Id</code>:</p>
<pre id="csrf-token">{token}</pre>
<p>Scripts that hold the <code>{SESSION_COOKIE}</code> cookie can read it as JSON from
<a href="session"><code>/users/session</code></a>.</p>
<form method="post" action="sign_out">
<input type="hidden" name="{CSRF_FIELD}" value="{token}">
<button type="submit">Sign out</button>
</form>"""
    return _document("Signed in", body, head=f'<meta name="csrf-token" content="{token}">')
