"""What kas answers itself on a workspace address: small HTML pages for browsers, JSON for everything else.

A browser is a client whose ``Accept`` lists ``text/html``. Every answer says what happened and what to do; none
carries a secret or echoes request input unescaped, and none may be cached or framed. A workspace that is not
running gets a page naming its state (starting, stopped, failed, terminated) with a link to the hub's console
and the GraphQL mutation that starts it; a starting workspace's page reloads itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape
from typing import Any

from aiohttp import web

from tether.modserver.gitlab_client import WorkspaceAuthorization

__all__ = ["WorkspaceStatePage", "error_response", "wants_html"]

#: Never cached (answers depend on who asks), never framed, nothing loaded from elsewhere.
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
_STYLE = "body{font-family:sans-serif;max-width:42em;margin:3em auto;padding:0 1em}code{background:#eee}"
#: Seconds a starting workspace's page waits before reloading itself.
STARTING_REFRESH_S = 5

#: Actual state -> (kind, HTTP status, what the user reads).
_STATES: dict[str, tuple[str, int, str]] = {
    "CreationRequested": ("starting", 503, "is being created"),
    "Starting": ("starting", 503, "is starting"),
    "Stopping": ("stopped", 503, "is stopping"),
    "Stopped": ("stopped", 503, "is stopped"),
    "Failed": ("failed", 503, "has failed"),
    "Error": ("failed", 503, "could not be created in the cluster"),
    "Terminating": ("terminated", 410, "is being terminated"),
    "Terminated": ("terminated", 410, "was terminated"),
}
_UNKNOWN = ("unknown", 503, "is in an unknown state")
#: Desired states under which a stopped workspace is on its way up: agentk has not reported the start yet
#: (one partial reconciliation, seconds), so the page says "starting" and asks to retry, not to start it.
_STARTING_DESIRED = frozenset({"Running", "RestartRequested"})
_ADVICE = {
    "starting": "This page reloads itself until the workspace runs.",
    "stopped": "Start it from the console, or with the GraphQL mutation below, then reload this page.",
    "failed": "See the reason below; restart it from the console, or with the GraphQL mutation below.",
    "terminated": "A terminated workspace cannot be started again: create a new one from the console.",
    "unknown": "The agent reported a state kas cannot interpret; try again in a moment or check the console.",
}


def wants_html(request: web.BaseRequest) -> bool:
    """Whether the client is a browser (its ``Accept`` lists ``text/html``)."""
    return "text/html" in request.headers.get("Accept", "").lower()


def _document(title: str, body: str, head: str = "") -> str:
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>{head}'
        f"<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def error_response(
    request: web.BaseRequest, code: int, title: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An answer kas makes itself: ``{"error": title, "message": message}`` or a page with both.

    Args:
        request: the client's request (``Accept`` picks the form).
        code: HTTP status.
        title: a few words, e.g. ``Forbidden``.
        message: the whole explanation (escaped in HTML).
        headers: extra headers (``WWW-Authenticate``, ``Retry-After``, ``Location``...).
    """
    answer_headers = {**_HEADERS, **(headers or {})}
    if wants_html(request):
        body = f"<h1>{escape(title)}</h1>\n<p>{escape(message)}</p>"
        return web.Response(status=code, text=_document(title, body), content_type="text/html", headers=answer_headers)
    payload = {"error": title, "message": message}
    return web.Response(status=code, text=json.dumps(payload), content_type="application/json", headers=answer_headers)


class WorkspaceStatePage:
    """Where a workspace's owner manages it, for the state pages.

    Args:
        console_url: the hub's workspaces page, e.g. ``https://gitlab.example.com/workspaces``.
        graphql_url: the hub's GraphQL endpoint, e.g. ``https://gitlab.example.com/api/graphql``.
    """

    def __init__(self, console_url: str, graphql_url: str) -> None:
        self._console_url = console_url
        self._graphql_url = graphql_url

    def answer(self, request: web.BaseRequest, ws: WorkspaceAuthorization) -> web.Response:
        """The page (or JSON) for workspace ``ws``, which is not running."""
        kind, code, what = _STATES.get(ws.actual_state, _UNKNOWN)
        if kind == "stopped" and ws.desired_state in _STARTING_DESIRED:
            kind, what = "starting", "is starting"
        gid = f"gid://gitlab/RemoteDevelopment::Workspace/{ws.workspace_id}"
        mutation = f'mutation {{ workspaceUpdate(input: {{id: "{gid}", desiredState: "Running"}}) {{ errors }} }}'
        headers = dict(_HEADERS)
        if kind == "starting":
            headers["Retry-After"] = str(STARTING_REFRESH_S)
        sentence = f"Workspace {ws.name} {what} (state {ws.actual_state}, desired {ws.desired_state})."
        if not wants_html(request):
            payload: dict[str, Any] = {
                "error": f"workspace {kind}",
                "message": f"{sentence} {_ADVICE[kind]}",
                "workspace": {
                    "id": gid,
                    "name": ws.name,
                    "actual_state": ws.actual_state,
                    "desired_state": ws.desired_state,
                    "reason": ws.message,
                },
                "console_url": self._console_url,
                "graphql_url": self._graphql_url,
            }
            if kind in ("stopped", "failed"):
                payload["start_mutation"] = mutation
            return web.Response(status=code, text=json.dumps(payload), content_type="application/json", headers=headers)
        head = f'<meta http-equiv="refresh" content="{STARTING_REFRESH_S}">' if kind == "starting" else ""
        parts = [f"<h1>Workspace {escape(ws.name)} {escape(what)}</h1>", f"<p>{escape(sentence)}</p>"]
        if ws.message:
            parts.append(f"<p>Reason: {escape(ws.message)}</p>")
        parts.append(f"<p>{escape(_ADVICE[kind])}</p>")
        parts.append(f'<p><a href="{escape(self._console_url)}">Your workspaces in the console</a></p>')
        if kind in ("stopped", "failed"):
            parts.append(
                f"<p>With the API: <code>POST {escape(self._graphql_url)}</code> with "
                f"<code>{escape(mutation)}</code></p>"
            )
        title = f"Workspace {ws.name} {kind}"
        return web.Response(
            status=code, text=_document(title, "\n".join(parts), head), content_type="text/html", headers=headers
        )
