"""Error responses shaped like GitLab's, for every failure path of the HTTP API.

* :class:`~tether.hub.errors.HubError` -> its status and body (``{"message": ...}``).
* Malformed requests (bad JSON, unknown or missing fields, wrong types) -> 400 ``{"error": "..."}`` naming each
  field, as GitLab's parameter validation does (``"name is missing"``).
* A database uniqueness race -> 409; unknown routes -> 404 ``{"error": "404 Not Found"}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.hub.errors import HubError

log = logging.getLogger(__name__)


def describe_validation_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """One sentence per pydantic error, naming the field: ``name is missing, foo is not a known field``."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        where = loc[0] if loc else ""
        field = ".".join(loc[1:]) or where or "request"
        kind = err.get("type", "")
        if kind == "json_invalid":
            parts.append(f"body is not valid JSON: {err.get('ctx', {}).get('error', 'decode error')}")
        elif kind == "missing":
            parts.append(f"{field} is missing")
        elif kind == "extra_forbidden":
            parts.append(f"{field} is not a known field")
        elif kind in ("model_attributes_type", "dict_type") and len(loc) == 1:
            parts.append(f"{where} must be a JSON object")
        else:
            parts.append(f"{field} is invalid: {err.get('msg', 'invalid value')}")
    return ", ".join(parts)


async def _hub_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HubError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=dict(exc.headers) or None)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"error": describe_validation_errors(exc.errors())}, status_code=400)


async def _integrity_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: constraint violation: %s", request.method, request.url.path, type(exc).__name__)
    return JSONResponse({"message": "409 Conflict - a record with these values already exists"}, status_code=409)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    text = {404: "404 Not Found", 405: "405 Method Not Allowed"}.get(exc.status_code, f"{exc.status_code} {exc.detail}")
    return JSONResponse({"error": text}, status_code=exc.status_code, headers=exc.headers)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(HubError, _hub_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(IntegrityError, _integrity_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
