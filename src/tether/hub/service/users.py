"""Users and personal access tokens (GitLab ``POST /users``, ``POST /users/:id/personal_access_tokens``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Select, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub import tokens
from tether.hub.db.namespaces import KIND_USER, Namespace
from tether.hub.db.types import utcnow
from tether.hub.db.users import PersonalAccessToken, User
from tether.hub.errors import BadRequest, Conflict, InvalidToken, NotFound, Unauthorized
from tether.hub.service.paths import path_taken
from tether.hub.service.principal import SCOPES, Principal
from tether.hub.validation import check_name, check_path
from tether.tool.ids import is_ascii_number, parse_id

log = logging.getLogger(__name__)
#: ``last_used_at`` is written at most this often per token, so authentication stays mostly read-only.
LAST_USED_UPDATE_INTERVAL = timedelta(minutes=1)


async def create_user(
    session: AsyncSession, username: str, name: str, email: str | None = None, admin: bool = False
) -> User:
    """Create a user and their personal namespace (path = username).

    Raises:
        BadRequest: invalid username (path rules) or name.
        Conflict: the username, its namespace path or the email is taken.
    """
    check_path(username, "username")
    name = check_name(name)
    if email is not None and ("@" not in email or len(email) > 255):
        raise BadRequest.field("email", "is invalid")
    if await session.scalar(select(User.id).where(func.lower(User.username) == username.lower())) is not None:
        raise Conflict({"username": ["has already been taken"]})
    if await path_taken(session, username):
        raise Conflict({"username": ["has already been taken (a group or project uses this path)"]})
    if email and await session.scalar(select(User.id).where(func.lower(User.email) == email.lower())) is not None:
        raise Conflict({"email": ["has already been taken"]})
    user = User(username=username, name=name, email=email, admin=admin, state="active", created_at=utcnow())
    session.add(user)
    await session.flush()
    session.add(
        Namespace(
            kind=KIND_USER,
            name=name,
            path=username,
            full_path=username,
            full_name=name,
            description="",
            owner_id=user.id,
            created_at=utcnow(),
        )
    )
    await session.flush()
    return user


async def get_user(session: AsyncSession, ref: str | int) -> User:
    """The user with numeric id ``ref`` or username ``ref``.

    Raises:
        NotFound: ``404 User Not Found``.
    """
    if isinstance(ref, int) or is_ascii_number(ref):
        row_id = parse_id(ref)
        user = await session.get(User, row_id) if row_id is not None else None
    else:
        user = await session.scalar(select(User).where(User.username == ref))
    if user is None:
        raise NotFound("User")
    return user


def users_query(username: str | None = None, search: str | None = None) -> Select[User]:
    """Users ordered by id, filtered by exact ``username`` or a case-insensitive ``search`` of name/username."""
    query = select(User).order_by(User.id)
    if username:
        query = query.where(func.lower(User.username) == username.lower())
    if search:
        text = search.lower()
        query = query.where(
            or_(
                func.lower(User.username).contains(text, autoescape=True),
                func.lower(User.name).contains(text, autoescape=True),
            )
        )
    return query


def check_scopes(scopes: Iterable[str], allowed: frozenset[str] = SCOPES) -> list[str]:
    """Return ``scopes`` sorted and deduplicated.

    Raises:
        BadRequest: on ``scopes``: empty or containing a scope outside ``allowed``.
    """
    wanted = sorted(set(scopes))
    if not wanted:
        raise BadRequest.field("scopes", "can't be blank")
    unknown = [s for s in wanted if s not in allowed]
    if unknown:
        raise BadRequest.field(
            "scopes",
            f"can only contain available scopes ({', '.join(sorted(allowed))}): {', '.join(unknown)} is not one",
        )
    return wanted


async def create_personal_access_token(
    session: AsyncSession,
    user: User,
    name: str,
    scopes: Iterable[str],
    expires_at: date | None = None,
    description: str = "",
    allowed_scopes: frozenset[str] = SCOPES,
) -> tuple[PersonalAccessToken, str]:
    """Create a token for ``user``; returns the row and the plain token (shown once, never stored).

    Args:
        session: open transaction.
        user: the token's owner.
        name: display name of the token (1..255 characters).
        scopes: scope names (``api``, ``read_api``, ``k8s_proxy``).
        expires_at: the first day (UTC) on which the token no longer works; must be after today. None: no expiry.
        description: free text, at most 255 characters.
        allowed_scopes: the scopes the caller may grant (``POST /user/personal_access_tokens``: ``k8s_proxy``).

    Raises:
        BadRequest: blank name, bad scopes, or an expiry date that is not in the future.
    """
    name = check_name(name)
    wanted = check_scopes(scopes, allowed_scopes)
    if expires_at is not None and expires_at <= datetime.now(UTC).date():
        raise BadRequest.field("expires_at", "must be in the future")
    if len(description) > 255:
        raise BadRequest.field("description", "is too long (maximum is 255 characters)")
    plain = tokens.new_personal_access_token()
    row = PersonalAccessToken(
        user_id=user.id,
        name=name,
        description=description,
        token_digest=tokens.digest(plain),
        scopes=wanted,
        expires_at=expires_at,
        revoked=False,
        created_at=utcnow(),
    )
    session.add(row)
    await session.flush()
    log.info("personal access token %d created for user %d with scopes %s", row.id, user.id, ",".join(wanted))
    return row, plain


def token_active(token: PersonalAccessToken, today: date | None = None) -> bool:
    """Not revoked and, if it expires, ``expires_at`` is after ``today`` (UTC)."""
    today = today or datetime.now(UTC).date()
    return not token.revoked and (token.expires_at is None or token.expires_at > today)


async def active_token(session: AsyncSession, plain: str) -> tuple[PersonalAccessToken, User]:
    """Find the active personal access token ``plain`` (looked up by digest) and its active user.

    Raises:
        InvalidToken: revoked or expired token (GitLab's ``invalid_token`` body).
        Unauthorized: unknown token, or a blocked user.
    """
    row = await session.scalar(
        select(PersonalAccessToken).where(PersonalAccessToken.token_digest == tokens.digest(plain))
    )
    if row is None:
        raise Unauthorized()
    if not token_active(row):
        raise InvalidToken(InvalidToken.REVOKED if row.revoked else InvalidToken.EXPIRED)
    user = await session.get_one(User, row.user_id)
    if user.state != "active":
        raise Unauthorized("401 Unauthorized - user is blocked")
    return row, user


async def authenticate(session: AsyncSession, plain: str) -> Principal:
    """Resolve a personal access token to the acting principal and note its use.

    Raises:
        Unauthorized: unknown, revoked or expired token, or a blocked user.
    """
    row, user = await active_token(session, plain)
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_UPDATE_INTERVAL:
        row.last_used_at = now
    return Principal(
        user_id=user.id, username=user.username, admin=user.admin, scopes=frozenset(row.scopes), token_id=row.id
    )


async def get_personal_access_token(session: AsyncSession, principal: Principal, token_id: int) -> PersonalAccessToken:
    """A token the principal may see (their own; administrators: any).

    Raises:
        NotFound: ``404 Personal Access Token Not Found``.
    """
    row = await session.get(PersonalAccessToken, token_id)
    if row is None or not (principal.admin or row.user_id == principal.user_id):
        raise NotFound("Personal Access Token")
    return row


def personal_access_tokens_query(principal: Principal, user_id: int | None = None) -> Select[PersonalAccessToken]:
    """The principal's own tokens; administrators see everyone's, optionally only ``user_id``'s."""
    query = select(PersonalAccessToken).order_by(PersonalAccessToken.id)
    if not principal.admin:
        return query.where(PersonalAccessToken.user_id == principal.user_id)
    if user_id is not None:
        query = query.where(PersonalAccessToken.user_id == user_id)
    return query


def revoke_personal_access_token(token: PersonalAccessToken) -> None:
    """Mark ``token`` revoked (idempotent)."""
    token.revoked = True
    log.info("personal access token %d revoked", token.id)
