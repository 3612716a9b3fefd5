"""Who is calling: a personal access token as a bearer token (tools), or the workspace session cookie (browsers).

``Authorization: Bearer <token>`` wins when present and must then be the only ``Authorization`` header and well
formed; the hub checks the token (scope ``api`` or ``read_api``). Otherwise the session cookie is checked here
first (signature, audience, expiry: :class:`~tether.modules.workspace_access.rpc.tokens.WorkspaceSession`), so
a forged or expired cookie costs no hub call; the hub then checks the hub session it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multidict import MultiMapping

from tether.modules.workspace_access import ACCESS_PAT, ACCESS_SESSION, SESSION_COOKIE
from tether.modules.workspace_access.rpc.tokens import WorkspaceSession
from tether.tool.jwt_auth import JwtError

__all__ = ["Credentials", "CredentialsError", "read_credentials"]

#: Longest token accepted, in characters (a personal access token is about 50).
_MAX_TOKEN = 1024


class CredentialsError(Exception):
    """The request carries malformed credentials (HTTP 401); the message says what is wrong."""


@dataclass(frozen=True)
class Credentials:
    """The credentials of one request.

    Attributes:
        access_type: ``personal_access_token`` or ``workspace_session``.
        access_key: the token, or the session cookie's value.
    """

    access_type: str
    access_key: str

    @property
    def from_cookie(self) -> bool:
        """Whether a browser session cookie carried them."""
        return self.access_type == ACCESS_SESSION


def read_credentials(
    headers: MultiMapping[str], cookies: Mapping[str, str], secret: bytes
) -> tuple[Credentials | None, bool]:
    """The request's credentials, and whether it sent a session cookie that is no longer valid.

    Args:
        headers: the request headers.
        cookies: the request cookies, name -> value.
        secret: the gitlab secret (session cookies are signed with it).

    Returns:
        (credentials or None when there are none, stale cookie). A stale cookie counts as none: the browser
        signs in again and the cookie is replaced.

    Raises:
        CredentialsError: several ``Authorization`` headers, another scheme than ``Bearer``, an empty or
            over-long token.
    """
    authorization = headers.getall("Authorization", [])
    if authorization:
        if len(authorization) != 1:
            raise CredentialsError(f"exactly one Authorization header is allowed, got {len(authorization)}")
        scheme, _, token = authorization[0].strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise CredentialsError("the Authorization header must be 'Bearer <personal access token>'")
        if len(token) > _MAX_TOKEN or not token.isprintable() or " " in token:
            raise CredentialsError("the bearer token is not a personal access token")
        return Credentials(ACCESS_PAT, token), False
    cookie = cookies.get(SESSION_COOKIE)
    if not cookie:
        return None, False
    try:
        WorkspaceSession.read(cookie, secret)
    except JwtError:
        return None, True
    return Credentials(ACCESS_SESSION, cookie), False
