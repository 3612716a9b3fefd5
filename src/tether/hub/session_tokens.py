"""Browser session secrets: the session id, its CSRF token, and the only forms the database keeps of them.

* The **session id** is 32 random bytes, URL-safe base64 (43 characters). It is the value of the hub's
  ``_gitlab_session`` cookie and, URL-escaped, of ``_gitlab_kas`` (the cookie kas reads, kas.md §4.5). The
  database keeps its SHA-256 digest only (:func:`tether.hub.tokens.digest`).
* The **CSRF token** is another 32 random bytes, drawn independently. The database keeps its SHA-256 digest, to
  check it (:func:`csrf_matches`, constant time), and a *sealed* copy so the holder of the session cookie can be
  shown it again (``GET /users/session``): the token XOR ``HMAC-SHA256(session id, "tether-hub csrf seal v1")``.
  The key exists only in the cookie, so the sealed copy alone reveals nothing; each key seals one value once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from urllib.parse import quote, unquote

from tether.hub import tokens

_RANDOM_BYTES = 32
_SEAL_LABEL = b"tether-hub csrf seal v1"


def new_session_id() -> str:
    """A new session id: 43 URL-safe characters (256 random bits)."""
    return secrets.token_urlsafe(_RANDOM_BYTES)


def new_csrf_token() -> str:
    """A new CSRF token: 43 URL-safe characters (256 random bits), independent of the session id."""
    return secrets.token_urlsafe(_RANDOM_BYTES)


def kas_cookie_value(session_id: str) -> str:
    """The ``_gitlab_kas`` cookie value: ``session_id`` URL-escaped (every reserved character escaped)."""
    return quote(session_id, safe="")


def session_id_from_kas_cookie(value: str) -> str:
    """The session id in a ``_gitlab_kas`` value, as kas forwards it (unescaping an unescaped id is harmless)."""
    return unquote(value)


def _seal_key(session_id: str) -> bytes:
    return hmac.new(session_id.encode(), _SEAL_LABEL, hashlib.sha256).digest()


def _decode(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def seal_csrf(csrf_token: str, session_id: str) -> str:
    """Seal ``csrf_token`` (from :func:`new_csrf_token`) with ``session_id``: 64 lowercase hex characters.

    Raises:
        ValueError: ``csrf_token`` is not 32 bytes of URL-safe base64.
    """
    raw = _decode(csrf_token)
    if len(raw) != _RANDOM_BYTES:
        raise ValueError("a CSRF token must be 32 bytes of URL-safe base64")
    return bytes(a ^ b for a, b in zip(raw, _seal_key(session_id), strict=True)).hex()


def unseal_csrf(sealed: str, session_id: str) -> str:
    """The CSRF token sealed by :func:`seal_csrf` with the same ``session_id``.

    Raises:
        ValueError: ``sealed`` is not 64 hex characters.
    """
    raw = bytes.fromhex(sealed)
    if len(raw) != _RANDOM_BYTES:
        raise ValueError("a sealed CSRF token is 64 hex characters")
    opened = bytes(a ^ b for a, b in zip(raw, _seal_key(session_id), strict=True))
    return base64.urlsafe_b64encode(opened).rstrip(b"=").decode()


def csrf_matches(given: str, stored_digest: str) -> bool:
    """Whether ``given`` is the CSRF token whose digest is ``stored_digest``, compared in constant time."""
    return hmac.compare_digest(tokens.digest(given), stored_digest)
