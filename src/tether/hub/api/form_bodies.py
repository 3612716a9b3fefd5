"""Accept GitLab's other body encodings on JSON endpoints.

GitLab (Grape) takes parameters form-encoded as well as in JSON, and scripts use both
(``curl --data "name=prod"``, or ``curl --data '{"name": "prod"}'`` without a content type). This middleware turns
such bodies into JSON before FastAPI reads them:

* ``application/x-www-form-urlencoded``: a body that looks like a JSON object is taken as JSON; otherwise the form
  fields become a JSON object, a repeated key or a ``key[]`` key becoming a list;
* no content type, or ``text/plain``: a body that looks like a JSON object is taken as JSON.

Values stay strings; the request models convert them (``"30"`` to 30, ``"true"`` to true). The internal API and
the configuration endpoint (a YAML body) are left alone. Bodies over 1 MiB are passed through untouched.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.hub.api.internal_auth import INTERNAL_PREFIX

_MAX_BYTES = 1024 * 1024
_METHODS = {"POST", "PUT", "PATCH"}


def form_to_json(body: bytes) -> bytes:
    """``a=1&b[]=x&b[]=y`` -> ``{"a": "1", "b": ["x", "y"]}`` (UTF-8 JSON)."""
    data: dict[str, Any] = {}
    for key, value in parse_qsl(body.decode(errors="replace"), keep_blank_values=True):
        is_list = key.endswith("[]")
        name = key[:-2] if is_list else key
        if name in data:
            existing = data[name]
            data[name] = [*existing, value] if isinstance(existing, list) else [existing, value]
        else:
            data[name] = [value] if is_list else value
    return json.dumps(data).encode()


def _wants_conversion(scope: Scope) -> bool:
    path = str(scope.get("path", ""))
    return (
        scope["type"] == "http"
        and scope.get("method") in _METHODS
        and path.startswith("/api/v4/")
        and not path.startswith(INTERNAL_PREFIX)
        and not path.endswith("/configuration")
    )


class FormBodyMiddleware:
    """ASGI middleware; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Rewrite a form or untyped body of a JSON endpoint as JSON."""
        if not _wants_conversion(scope):
            await self._app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k not in (b"content-type", b"content-length")]
        content_type = dict(scope.get("headers", [])).get(b"content-type", b"").split(b";")[0].strip().lower()
        if content_type not in (b"", b"text/plain", b"application/x-www-form-urlencoded"):
            await self._app(scope, receive, send)
            return
        body, more, messages = b"", True, []
        while more and len(body) <= _MAX_BYTES:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
        if more or len(body) > _MAX_BYTES or (messages and messages[-1]["type"] != "http.request"):
            await self._app(scope, _replay(messages, receive), send)
            return
        looks_json = body.lstrip()[:1] == b"{"
        if looks_json:
            new_body = body
        elif content_type == b"application/x-www-form-urlencoded":
            new_body = form_to_json(body)
        else:
            await self._app(scope, _replay(messages, receive), send)
            return
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(new_body)).encode())]
        converted = dict(scope, headers=headers)
        await self._app(
            converted, _replay([{"type": "http.request", "body": new_body, "more_body": False}], receive), send
        )


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
