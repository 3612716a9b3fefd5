"""The three JWTs of the workspaces' browser sign-in, signed with the gitlab secret kas and the hub share.

The flow (docs/workspaces.md "Reaching a workspace"), for a browser without a workspace session:

1. kas sets the state cookie (a random nonce) and redirects to the hub's sign-in for workspaces with an
   :class:`AuthorizeRequest` (``iss=gitlab-kas``): where to send the answer (the callback on the workspace's
   own origin, which kas checked is one it serves), where to go afterwards, and the nonce's digest.
2. The hub signs the browser in if needed (its own sign-in page) and redirects to the callback with a
   :class:`SignInCode` (``iss=gitlab``, 60 s): the user, the hub session, the echoed request.
3. kas checks that the code's nonce digest is that of the browser's state cookie (a code stolen from a URL is
   useless without the cookie) and that it was issued for this callback, then sets the session cookie, a
   :class:`WorkspaceSession` (``iss=gitlab-kas``) that lives as long as the hub session. The hub checks it on
   every authorization, so signing out of the hub ends it (after kas' cache TTL).

Each token has its own audience, none of which the internal API (``aud=gitlab``) or kas' api listener
(``aud=gitlab-kas``) accepts, so none can stand in for another or for a service JWT.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from tether.tool.jwt_auth import ISSUER_GITLAB, ISSUER_KAS, JwtError, mint, verify

__all__ = [
    "AUTHORIZE_REQUEST_AUDIENCE",
    "AUTHORIZE_REQUEST_LIFETIME_S",
    "CODE_AUDIENCE",
    "CODE_LIFETIME_S",
    "SESSION_AUDIENCE",
    "AuthorizeRequest",
    "SignInCode",
    "WorkspaceSession",
    "new_nonce",
    "nonce_digest",
    "nonce_matches",
]

AUTHORIZE_REQUEST_AUDIENCE = "tether-workspaces-authorize"
CODE_AUDIENCE = "tether-workspaces-code"
SESSION_AUDIENCE = "tether-workspaces-session"
#: A user has this long to sign in at the hub before the request must be started again.
AUTHORIZE_REQUEST_LIFETIME_S = 600.0
#: The code travels in a URL: it is good for one minute.
CODE_LIFETIME_S = 60.0
#: Longest URL or path carried in a token, in characters.
_MAX_URL = 4096


def new_nonce() -> str:
    """A fresh state-cookie nonce: 43 URL-safe characters (256 random bits)."""
    return secrets.token_urlsafe(32)


def nonce_digest(nonce: str) -> str:
    """SHA-256 of ``nonce`` as 64 lowercase hex characters (only the digest travels in URLs)."""
    return hashlib.sha256(nonce.encode()).hexdigest()


def nonce_matches(nonce: str, digest: str) -> bool:
    """Whether ``nonce`` hashes to ``digest``, compared in constant time."""
    return hmac.compare_digest(nonce_digest(nonce), digest)


def _text(claims: dict[str, Any], name: str, limit: int = _MAX_URL) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise JwtError(f"claim {name!r} is missing or not a string of at most {limit} characters")
    return value


def _number(claims: dict[str, Any], name: str) -> int:
    value = claims.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
        raise JwtError(f"claim {name!r} is missing or not a positive integer")
    return value


def _user(claims: dict[str, Any]) -> int:
    subject = _text(claims, "sub", 19)
    if not subject.isdigit() or not subject.isascii():
        raise JwtError("claim 'sub' must be a user id")
    return int(subject)


@dataclass(frozen=True)
class AuthorizeRequest:
    """kas asks the hub to sign a browser in for workspaces (step 1).

    Attributes:
        callback_url: absolute URL of :data:`~tether.modules.workspace_access.CALLBACK_PATH` on the workspace's
            origin, e.g. ``https://60001-ws.workspaces.example.com/-/workspaces/-/callback``.
        return_to: path and query to go back to on that origin, starting with ``/``.
        nonce_sha256: :func:`nonce_digest` of the browser's state cookie.
    """

    callback_url: str
    return_to: str
    nonce_sha256: str

    def mint(self, secret: bytes) -> str:
        """The signed request (``iss=gitlab-kas``, valid :data:`AUTHORIZE_REQUEST_LIFETIME_S`)."""
        claims = {"cb": self.callback_url, "ret": self.return_to, "nh": self.nonce_sha256}
        return mint(secret, ISSUER_KAS, AUTHORIZE_REQUEST_AUDIENCE, AUTHORIZE_REQUEST_LIFETIME_S, extra=claims)

    @classmethod
    def read(cls, token: str, secret: bytes) -> AuthorizeRequest:
        """Verify and decode a request.

        Raises:
            JwtError: bad signature, expired, wrong issuer or audience, or a claim missing or malformed.
        """
        claims = verify(token, secret, AUTHORIZE_REQUEST_AUDIENCE, ISSUER_KAS)
        request = cls(_text(claims, "cb"), _text(claims, "ret"), _text(claims, "nh", 64))
        if not request.return_to.startswith("/") or request.return_to.startswith("//"):
            raise JwtError("claim 'ret' must be a path on the callback's origin")
        return request


@dataclass(frozen=True)
class SignInCode:
    """The hub's answer (step 2): who signed in, with which hub session.

    Attributes:
        user_id: the signed-in user.
        session_id: the hub session's row id (signing out deletes it).
        session_expires_at: when the hub session ends, Unix time in seconds.
        request: the :class:`AuthorizeRequest` answered.
    """

    user_id: int
    session_id: int
    session_expires_at: int
    request: AuthorizeRequest

    def mint(self, secret: bytes) -> str:
        """The signed code (``iss=gitlab``, valid :data:`CODE_LIFETIME_S`)."""
        claims = {
            "sub": str(self.user_id),
            "sid": self.session_id,
            "sexp": self.session_expires_at,
            "cb": self.request.callback_url,
            "ret": self.request.return_to,
            "nh": self.request.nonce_sha256,
        }
        return mint(secret, ISSUER_GITLAB, CODE_AUDIENCE, CODE_LIFETIME_S, extra=claims)

    @classmethod
    def read(cls, token: str, secret: bytes) -> SignInCode:
        """Verify and decode a code.

        Raises:
            JwtError: as :meth:`AuthorizeRequest.read`.
        """
        claims = verify(token, secret, CODE_AUDIENCE, ISSUER_GITLAB)
        request = AuthorizeRequest(_text(claims, "cb"), _text(claims, "ret"), _text(claims, "nh", 64))
        return cls(_user(claims), _number(claims, "sid"), _number(claims, "sexp"), request)


@dataclass(frozen=True)
class WorkspaceSession:
    """The workspace session cookie's content (step 3).

    Attributes:
        user_id: the signed-in user.
        session_id: the hub session it stands for.
        expires_at: Unix time in seconds; the hub session's end.
    """

    user_id: int
    session_id: int
    expires_at: int

    def mint(self, secret: bytes, now: float) -> str:
        """The cookie value (``iss=gitlab-kas``), valid until :attr:`expires_at`."""
        claims = {"sub": str(self.user_id), "sid": self.session_id}
        return mint(secret, ISSUER_KAS, SESSION_AUDIENCE, max(self.expires_at - now, 0.0), now=now, extra=claims)

    @classmethod
    def read(cls, token: str, secret: bytes) -> WorkspaceSession:
        """Verify and decode a cookie value.

        Raises:
            JwtError: as :meth:`AuthorizeRequest.read`.
        """
        claims = verify(token, secret, SESSION_AUDIENCE, ISSUER_KAS)
        return cls(_user(claims), _number(claims, "sid"), _number(claims, "exp"))
