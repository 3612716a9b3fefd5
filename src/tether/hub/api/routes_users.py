"""``/user``, ``/users`` and personal access tokens (GitLab "Users API", "Personal access tokens API")."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tether.hub.api.auth import AdminWriter, Authenticated, Reader, Writer
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import fetch_page, set_headers
from tether.hub.api.schemas_in import PersonalAccessTokenCreate, UserCreate
from tether.hub.api.schemas_out import PersonalAccessTokenCreated, PersonalAccessTokenOut, UserOut, pat_out, user_out
from tether.hub.errors import NotFound
from tether.hub.ids import RowId
from tether.hub.service import users
from tether.hub.service.principal import SCOPE_K8S_PROXY

router = APIRouter(tags=["users"])


@router.get("/user", summary="The authenticated user")
async def current_user(state: State, principal: Reader) -> UserOut:
    """The user the token belongs to."""
    async with state.db.transaction() as session:
        assert principal.user_id is not None
        user = await users.get_user(session, principal.user_id)
        return user_out(user, state.config.base_url, principal)


@router.get("/users", summary="List users")
async def list_users(
    request: Request,
    response: Response,
    state: State,
    principal: Reader,
    paging: Paging,
    username: str | None = None,
    search: str | None = None,
) -> list[UserOut]:
    """Users by id; ``username`` filters exactly, ``search`` by part of the name or username."""
    async with state.db.transaction() as session:
        items, total = await fetch_page(session, users.users_query(username, search), paging)
    set_headers(request, response, paging, total)
    return [user_out(u, state.config.base_url, principal) for u in items]


@router.get("/users/{user_id}", summary="Get a user")
async def get_user(state: State, principal: Reader, user_id: str) -> UserOut:
    """One user, by id or username."""
    async with state.db.transaction() as session:
        return user_out(await users.get_user(session, ref(user_id)), state.config.base_url, principal)


@router.post("/users", status_code=201, summary="Create a user (administrators)")
async def create_user(state: State, principal: AdminWriter, body: UserCreate) -> UserOut:
    """Create a user and their personal namespace. 409 when the username or email is taken."""
    async with state.db.transaction() as session:
        user = await users.create_user(session, body.username, body.name, body.email, body.admin)
        return user_out(user, state.config.base_url, principal)


@router.post(
    "/users/{user_id}/personal_access_tokens",
    status_code=201,
    summary="Create a personal access token for a user (administrators)",
)
async def create_user_token(
    state: State, principal: AdminWriter, user_id: str, body: PersonalAccessTokenCreate
) -> PersonalAccessTokenCreated:
    """The answer holds the plain ``token``: it is shown only this once."""
    async with state.db.transaction() as session:
        user = await users.get_user(session, ref(user_id))
        row, plain = await users.create_personal_access_token(
            session, user, body.name, body.scopes, body.expires_at, body.description
        )
        return PersonalAccessTokenCreated(**pat_out(row).model_dump(), token=plain)


@router.post("/user/personal_access_tokens", status_code=201, summary="Create a k8s_proxy token for yourself")
async def create_own_token(
    state: State, principal: Writer, body: PersonalAccessTokenCreate
) -> PersonalAccessTokenCreated:
    """GitLab rule: a user may create their own tokens with the ``k8s_proxy`` scope only."""
    async with state.db.transaction() as session:
        assert principal.user_id is not None
        user = await users.get_user(session, principal.user_id)
        row, plain = await users.create_personal_access_token(
            session,
            user,
            body.name,
            body.scopes,
            body.expires_at,
            body.description,
            allowed_scopes=frozenset({SCOPE_K8S_PROXY}),
        )
        return PersonalAccessTokenCreated(**pat_out(row).model_dump(), token=plain)


@router.get("/personal_access_tokens", summary="List personal access tokens")
async def list_tokens(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, user_id: RowId | None = None
) -> list[PersonalAccessTokenOut]:
    """Your tokens; administrators see everyone's, or one user's with ``user_id``."""
    async with state.db.transaction() as session:
        items, total = await fetch_page(session, users.personal_access_tokens_query(principal, user_id), paging)
    set_headers(request, response, paging, total)
    return [pat_out(row) for row in items]


@router.get("/personal_access_tokens/self", summary="The token used for this request")
async def get_self_token(state: State, principal: Authenticated) -> PersonalAccessTokenOut:
    """Metadata of the calling token; any scope may read it (glab's ``get-token --check-revoked`` uses it)."""
    if principal.token_id is None:
        raise NotFound("Personal Access Token")
    async with state.db.transaction() as session:
        return pat_out(await users.get_personal_access_token(session, principal, principal.token_id))


@router.get("/personal_access_tokens/{token_id}", summary="Get a personal access token")
async def get_token(state: State, principal: Reader, token_id: RowId) -> PersonalAccessTokenOut:
    """One of your tokens (administrators: any)."""
    async with state.db.transaction() as session:
        return pat_out(await users.get_personal_access_token(session, principal, token_id))


@router.delete("/personal_access_tokens/self", status_code=204, summary="Revoke the token used for this request")
async def revoke_self_token(state: State, principal: Writer) -> Response:
    """Revoke the calling token."""
    if principal.token_id is None:
        raise NotFound("Personal Access Token")
    async with state.db.transaction() as session:
        users.revoke_personal_access_token(
            await users.get_personal_access_token(session, principal, principal.token_id)
        )
    return Response(status_code=204)


@router.delete("/personal_access_tokens/{token_id}", status_code=204, summary="Revoke a personal access token")
async def revoke_token(state: State, principal: Writer, token_id: RowId) -> Response:
    """Revoke one of your tokens (administrators: any)."""
    async with state.db.transaction() as session:
        users.revoke_personal_access_token(await users.get_personal_access_token(session, principal, token_id))
    return Response(status_code=204)
