"""Browser sessions: sign in with a username and a personal access token, resolve and end a session.

The hub has no passwords. Signing in takes one of the user's personal access tokens with scope ``api`` or
``k8s_proxy``; the session then stands for the user (no scopes) wherever the hub accepts a session: its own
``/users/session`` and ``/users/sign_out``, and kas' Kubernetes API proxy through ``authorize_proxy_user`` with
``access_type: session_cookie`` (kas.md §4.5). Session ids and CSRF tokens are never stored or logged in plain
text (:mod:`tether.hub.session_tokens`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub import session_tokens, tokens
from tether.hub.db.sessions import UserSession
from tether.hub.db.types import utcnow
from tether.hub.db.users import User
from tether.hub.errors import Unauthorized
from tether.hub.service import users
from tether.hub.service.principal import SCOPE_API, SCOPE_K8S_PROXY

log = logging.getLogger(__name__)
#: The scopes of which a sign-in token needs at least one.
SIGN_IN_SCOPES = frozenset({SCOPE_API, SCOPE_K8S_PROXY})
#: ``last_used_at`` of a session is written at most this often.
LAST_USED_UPDATE_INTERVAL = timedelta(minutes=1)
#: The one message for every refused sign-in, so that it tells nothing about which part was wrong.
SIGN_IN_REFUSED = "Invalid login or token."


@dataclass(frozen=True)
class ActiveSession:
    """A live session and what its holder may be shown.

    Attributes:
        row: the session.
        user: its user (active).
        session_id: the plain session id, from the caller's cookie (never stored).
        csrf_token: the plain CSRF token, unsealed with ``session_id`` (never stored).
    """

    row: UserSession
    user: User
    session_id: str
    csrf_token: str


async def sign_in(session: AsyncSession, login: str, token: str, lifetime_s: float) -> ActiveSession:
    """Check ``login`` and ``token`` and create a session for the user; expired sessions of anyone are purged.

    Args:
        session: open transaction.
        login: the username (case-insensitive).
        token: a personal access token of that user: active, with scope ``api`` or ``k8s_proxy``.
        lifetime_s: seconds until the session expires (more than 0).

    Raises:
        Unauthorized: ``"Invalid login or token."`` for every failure (unknown, revoked or expired token, a token
            of another user, a token without the scopes, a blocked user), so the answer does not say which.
    """
    try:
        principal = await users.authenticate(session, token)
    except Unauthorized:
        log.info("sign-in refused: unknown, revoked or expired token, or a blocked user")
        raise Unauthorized(SIGN_IN_REFUSED) from None
    if principal.username.lower() != login.strip().lower():
        log.info("sign-in refused: token %s does not belong to the login given", principal.token_id)
        raise Unauthorized(SIGN_IN_REFUSED)
    if not principal.scopes & SIGN_IN_SCOPES:
        log.info("sign-in refused: token %s has neither scope api nor k8s_proxy", principal.token_id)
        raise Unauthorized(SIGN_IN_REFUSED)
    assert principal.user_id is not None
    now = utcnow()
    await session.execute(delete(UserSession).where(UserSession.expires_at <= now))
    session_id, csrf_token = session_tokens.new_session_id(), session_tokens.new_csrf_token()
    row = UserSession(
        user_id=principal.user_id,
        session_digest=tokens.digest(session_id),
        csrf_digest=tokens.digest(csrf_token),
        csrf_sealed=session_tokens.seal_csrf(csrf_token, session_id),
        created_at=now,
        expires_at=now + timedelta(seconds=lifetime_s),
        last_used_at=now,
    )
    session.add(row)
    await session.flush()
    user = await session.get_one(User, principal.user_id)
    log.info(
        "session %d created for user %d with token %s, expires %s", row.id, user.id, principal.token_id, row.expires_at
    )
    return ActiveSession(row=row, user=user, session_id=session_id, csrf_token=csrf_token)


async def active_session(session: AsyncSession, session_id: str) -> ActiveSession:
    """The live session ``session_id`` (a ``_gitlab_session`` value, or an unescaped ``_gitlab_kas`` one).

    Notes the use in ``last_used_at``, at most once a minute.

    Raises:
        Unauthorized: empty, unknown (never created, or signed out) or expired session, or a blocked user; the
            message says which.
    """
    if not session_id:
        raise Unauthorized("401 Unauthorized - no session: sign in at /users/sign_in")
    row = await session.scalar(select(UserSession).where(UserSession.session_digest == tokens.digest(session_id)))
    if row is None:
        raise Unauthorized("401 Unauthorized - unknown or signed-out session: sign in at /users/sign_in")
    now = utcnow()
    if row.expires_at <= now:
        log.info("session %d of user %d has expired", row.id, row.user_id)
        raise Unauthorized("401 Unauthorized - the session has expired: sign in again at /users/sign_in")
    user = await session.get_one(User, row.user_id)
    if user.state != "active":
        raise Unauthorized("401 Unauthorized - user is blocked")
    if now - row.last_used_at > LAST_USED_UPDATE_INTERVAL:
        row.last_used_at = now
    csrf_token = session_tokens.unseal_csrf(row.csrf_sealed, session_id)
    return ActiveSession(row=row, user=user, session_id=session_id, csrf_token=csrf_token)


def check_csrf(active: ActiveSession, csrf_token: str) -> None:
    """Check that ``csrf_token`` is the session's CSRF token (constant-time comparison of digests).

    Raises:
        Unauthorized: empty or different token.
    """
    if not csrf_token:
        raise Unauthorized("401 Unauthorized - the CSRF token is missing")
    if not session_tokens.csrf_matches(csrf_token, active.row.csrf_digest):
        log.info("session %d: the CSRF token given does not belong to it", active.row.id)
        raise Unauthorized("401 Unauthorized - the CSRF token does not belong to this session")


async def proxy_user(session: AsyncSession, kas_cookie: str, csrf_token: str) -> tuple[User, int]:
    """The user behind kas' ``session_cookie`` credential (kas.md §4.5) and the session's id (for the audit trail).

    Args:
        session: open transaction.
        kas_cookie: the ``_gitlab_kas`` value as kas forwards it (URL-unescaped again here; harmless).
        csrf_token: from the client's ``X-Csrf-Token`` header or ``gitlab-csrf-token`` query parameter.

    Raises:
        Unauthorized: as :func:`active_session` and :func:`check_csrf`.
    """
    active = await active_session(session, session_tokens.session_id_from_kas_cookie(kas_cookie))
    check_csrf(active, csrf_token)
    return active.user, active.row.id


async def sign_out(session: AsyncSession, active: ActiveSession) -> None:
    """Delete the session: its cookies stop working everywhere, kas included (after kas' cache TTL)."""
    await session.execute(delete(UserSession).where(UserSession.id == active.row.id))
    log.info("session %d of user %d signed out", active.row.id, active.user.id)
