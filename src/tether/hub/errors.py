"""Errors of the hub's operations, each with the HTTP status and GitLab-shaped body the REST API answers with.

GitLab answers ``{"message": "404 Project Not Found"}`` for missing things, ``{"message": {"field": ["problem"]}}``
for model validation, and ``{"error": "name is missing"}`` for malformed parameters; the hub does the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class HubError(Exception):
    """Base class; ``status`` is the HTTP status, :meth:`body` the JSON body."""

    status = 500
    #: Extra response headers.
    headers: ClassVar[Mapping[str, str]] = {}

    def __init__(self, message: str | dict[str, list[str]]) -> None:
        super().__init__(message if isinstance(message, str) else _flatten(message))
        self.message = message

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"message": self.message}


def _flatten(fields: dict[str, list[str]]) -> str:
    return "; ".join(f"{field} {problem}" for field, problems in fields.items() for problem in problems)


class BadRequest(HubError):
    """400: a value breaks a rule; ``message`` maps the field to its problems when one field is at fault."""

    status = 400

    @classmethod
    def field(cls, name: str, problem: str) -> BadRequest:
        """The error for one field, e.g. ``BadRequest.field("name", "is too long (maximum is 63 characters)")``."""
        return cls({name: [problem]})


class Unauthorized(HubError):
    """401: no valid credentials."""

    status = 401

    def __init__(self, message: str = "401 Unauthorized") -> None:
        super().__init__(message)


class InvalidToken(Unauthorized):
    """401 for a revoked or expired token, with GitLab's OAuth-style body (glab's ``--check-revoked`` reads it)."""

    REVOKED = "Token was revoked. You have to re-authorize from the user."
    EXPIRED = "Token has expired."

    def __init__(self, description: str) -> None:
        super().__init__("invalid_token")
        self.description = description

    def body(self) -> dict[str, Any]:
        """``{"error": "invalid_token", "error_description": ...}`` as GitLab answers."""
        return {"error": "invalid_token", "error_description": self.description}


class TooManyRequests(HubError):
    """429: too many failed authentications from this address; retry after a minute."""

    status = 429
    headers: ClassVar[Mapping[str, str]] = {"Retry-After": "60"}

    def __init__(self, message: str = "429 Too Many Requests - too many failed sign-ins, try again later") -> None:
        super().__init__(message)


class Forbidden(HubError):
    """403: authenticated, but not allowed."""

    status = 403

    def __init__(self, message: str = "403 Forbidden") -> None:
        super().__init__(message)


class InsufficientScope(Forbidden):
    """403 for a token whose scopes do not allow the call (GitLab's OAuth-style body)."""

    def __init__(self, needed: tuple[str, ...]) -> None:
        super().__init__("insufficient_scope")
        self.needed = needed

    def body(self) -> dict[str, Any]:
        """GitLab's ``insufficient_scope`` body, listing the scopes that would do."""
        return {
            "error": "insufficient_scope",
            "error_description": "The request requires higher privileges than provided by the access token.",
            "scope": " ".join(self.needed),
        }


class NotFound(HubError):
    """404; ``what`` names the thing, e.g. ``Project`` gives ``404 Project Not Found``."""

    status = 404

    def __init__(self, what: str = "") -> None:
        super().__init__(f"404 {what} Not Found" if what else "404 Not found")


class Conflict(HubError):
    """409: the thing already exists (duplicate name or path)."""

    status = 409
