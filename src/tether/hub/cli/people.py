"""``tether hub bootstrap``, ``tether hub user ...`` and ``tether hub token ...``."""

from __future__ import annotations

from datetime import date, datetime

import click
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.cli.common import in_transaction, print_secret, print_table
from tether.hub.cli.context import HubContext, pass_hub
from tether.hub.db.users import PersonalAccessToken, User
from tether.hub.service import users
from tether.hub.service.principal import Principal

_SCOPES = click.option(
    "--scopes",
    default="api,k8s_proxy",
    show_default=True,
    help="Comma-separated scopes: api, read_api, k8s_proxy.",
)
_EXPIRES = click.option(
    "--expires-at", type=click.DateTime(["%Y-%m-%d"]), default=None, help="First day (UTC) the token stops working."
)


def _day(value: datetime | None) -> date | None:
    return value.date() if value is not None else None


@click.command("bootstrap")
@click.option("--username", default="root", show_default=True, help="The administrator's username.")
@click.option("--name", default="Administrator", show_default=True, help="The administrator's display name.")
@click.option("--token-name", default="bootstrap", show_default=True, help="Name of the new token.")
@_SCOPES
@_EXPIRES
@pass_hub
def bootstrap(
    hub: HubContext, username: str, name: str, token_name: str, scopes: str, expires_at: datetime | None
) -> None:
    """Create the first administrator (if missing) and print a new personal access token for them.

    Safe to run again: an existing administrator of that name just gets another token. The token is printed
    alone on stdout, e.g. `TOKEN=$(tether hub bootstrap)`.
    """

    async def work(session: AsyncSession, _op: Principal) -> str:
        user = await session.scalar(select(User).where(func.lower(User.username) == username.lower()))
        if user is None:
            user = await users.create_user(session, username, name, admin=True)
        elif not user.admin:
            raise click.ClickException(f"user {username!r} exists and is not an administrator")
        _row, plain = await users.create_personal_access_token(
            session, user, token_name, scopes.split(","), _day(expires_at)
        )
        return plain

    print_secret(f"personal access token of administrator {username}", in_transaction(hub, work))


@click.group("user")
def user_group() -> None:
    """Manage users."""


@user_group.command("create")
@click.argument("username")
@click.option("--name", default=None, help="Display name (default: the username).")
@click.option("--email", default=None, help="Email address (optional).")
@click.option("--admin", is_flag=True, help="Make the user an administrator.")
@pass_hub
def user_create(hub: HubContext, username: str, name: str | None, email: str | None, admin: bool) -> None:
    """Create USERNAME (and its personal namespace)."""

    async def work(session: AsyncSession, _op: Principal) -> int:
        return (await users.create_user(session, username, name or username, email, admin)).id

    click.echo(f"user {username} created with id {in_transaction(hub, work)}")


@user_group.command("list")
@pass_hub
def user_list(hub: HubContext) -> None:
    """List users as a table."""

    async def work(session: AsyncSession, _op: Principal) -> list[User]:
        return list(await session.scalars(users.users_query()))

    rows = [(u.id, u.username, u.name, "yes" if u.admin else "", u.state) for u in in_transaction(hub, work)]
    print_table("users", ["id", "username", "name", "admin", "state"], rows)


@click.group("token")
def token_group() -> None:
    """Manage personal access tokens."""


@token_group.command("create")
@click.argument("username")
@click.option("--name", "token_name", default="cli", show_default=True, help="Name of the token.")
@_SCOPES
@_EXPIRES
@pass_hub
def token_create(hub: HubContext, username: str, token_name: str, scopes: str, expires_at: datetime | None) -> None:
    """Create a personal access token for USERNAME and print it once (alone on stdout)."""

    async def work(session: AsyncSession, _op: Principal) -> str:
        user = await users.get_user(session, username)
        _row, plain = await users.create_personal_access_token(
            session, user, token_name, scopes.split(","), _day(expires_at)
        )
        return plain

    print_secret(f"personal access token of {username}", in_transaction(hub, work))


@token_group.command("list")
@click.argument("username", required=False)
@pass_hub
def token_list(hub: HubContext, username: str | None) -> None:
    """List personal access tokens (of USERNAME, or everyone's) as a table; tokens themselves are never shown."""

    async def work(session: AsyncSession, op: Principal) -> list[PersonalAccessToken]:
        user_id = (await users.get_user(session, username)).id if username else None
        return list(await session.scalars(users.personal_access_tokens_query(op, user_id)))

    rows = [
        (
            t.id,
            t.user_id,
            t.name,
            ",".join(t.scopes),
            t.expires_at,
            "yes" if users.token_active(t) else "no",
            t.last_used_at,
        )
        for t in in_transaction(hub, work)
    ]
    print_table("personal access tokens", ["id", "user", "name", "scopes", "expires", "active", "last used"], rows)


@token_group.command("revoke")
@click.argument("token_id", type=int)
@pass_hub
def token_revoke(hub: HubContext, token_id: int) -> None:
    """Revoke personal access token TOKEN_ID."""

    async def work(session: AsyncSession, op: Principal) -> None:
        users.revoke_personal_access_token(await users.get_personal_access_token(session, op, token_id))

    in_transaction(hub, work)
    click.echo(f"personal access token {token_id} revoked")
