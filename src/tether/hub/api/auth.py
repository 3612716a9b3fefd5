"""REST authentication: a personal access token in ``PRIVATE-TOKEN`` or ``Authorization: Bearer`` (GitLab).

Reads need scope ``api`` or ``read_api``; writes need ``api``; a ``k8s_proxy``-only token has no REST access
(GitLab "Personal access token scopes") except what GitLab allows any valid token: reading its own metadata
(``/personal_access_tokens/self``) and the instance metadata (``/metadata``). The ``private_token`` query
parameter GitLab also accepts is not supported: tokens in URLs end up in logs.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from tether.hub.api.state import hub_state
from tether.hub.errors import Forbidden, InsufficientScope, Unauthorized
from tether.hub.service import users
from tether.hub.service.principal import Principal

_private_token = APIKeyHeader(name="PRIVATE-TOKEN", auto_error=False, description="A personal access token.")
_bearer = HTTPBearer(auto_error=False, description="A personal access token.")


async def authenticated(
    request: Request,
    private_token: Annotated[str | None, Security(_private_token)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> Principal:
    """The principal behind the request's token.

    Raises:
        Unauthorized: no token, or an unknown, revoked or expired one.
        TooManyRequests: this client address failed too often (``api/throttle.py``).
    """
    token = private_token or (bearer.credentials if bearer is not None else None)
    if not token:
        raise Unauthorized()
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            await state.throttle.check(request, session)
            return await users.authenticate(session, token)
    except Unauthorized:
        await state.throttle.failed(request)
        raise


def _reader(principal: Annotated[Principal, Depends(authenticated)]) -> Principal:
    if not principal.can_read:
        raise InsufficientScope(("api", "read_api"))
    return principal


def _writer(principal: Annotated[Principal, Depends(authenticated)]) -> Principal:
    if not principal.can_write:
        raise InsufficientScope(("api",))
    return principal


def _admin_writer(principal: Annotated[Principal, Depends(_writer)]) -> Principal:
    if not principal.admin:
        raise Forbidden("403 Forbidden - administrators only")
    return principal


#: A principal with a valid token of any scope (``GET /personal_access_tokens/self``, ``GET /metadata``).
Authenticated = Annotated[Principal, Depends(authenticated)]
#: A principal whose token may read (``api`` or ``read_api``).
Reader = Annotated[Principal, Depends(_reader)]
#: A principal whose token may write (``api``).
Writer = Annotated[Principal, Depends(_writer)]
#: An administrator whose token may write.
AdminWriter = Annotated[Principal, Depends(_admin_writer)]
