"""What every ``tether hub`` sub-command shares: the configuration, a database transaction, tables, errors.

Data commands work on the database directly (like ``gitlab-rails runner``), acting as the operator: an
administrator with no user record. They apply pending migrations first unless ``auto_migrate`` is off.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import click
import uvloop
from alembic.util import CommandError
from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.cli.context import HubContext
from tether.hub.config import ConfigError
from tether.hub.db.engine import Database
from tether.hub.db.migrate import SchemaNotCurrent
from tether.hub.errors import HubError
from tether.hub.server import prepare_database
from tether.hub.service.principal import Principal
from tether.tool.secrets import SecretError

T = TypeVar("T")
#: Human-readable output goes to stderr; stdout carries only what scripts capture (tokens, tables).
err_console = Console(stderr=True, soft_wrap=True)
out_console = Console()


def run(coro: Awaitable[T]) -> T:
    """Run ``coro`` to completion, turning the hub's errors into one-line CLI errors.

    Raises:
        click.ClickException: a HubError, configuration, secret, schema or database problem.
    """

    async def wrapper() -> T:
        return await coro

    try:
        return uvloop.run(wrapper())
    except HubError as exc:
        raise click.ClickException(str(exc)) from exc
    except (ConfigError, SecretError, SchemaNotCurrent, CommandError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    except SQLAlchemyError as exc:
        raise click.ClickException(f"database error: {exc.__class__.__name__}: {exc}") from exc


def in_transaction(ctx: HubContext, work: Callable[[AsyncSession, Principal], Awaitable[T]]) -> T:
    """Prepare the database, then run ``work(session, operator)`` in one transaction (rolled back on error)."""
    config = ctx.config()

    async def go() -> T:
        await prepare_database(config)
        db = Database(config.database_url)
        try:
            async with db.transaction() as session:
                return await work(session, Principal.operator())
        finally:
            await db.close()

    return run(go())


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a table to stdout."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    out_console.print(table)


def print_secret(what: str, token: str) -> None:
    """Tell the person (stderr) that ``token`` is shown once; print the token alone on stdout."""
    err_console.print(f"[bold]{what}[/bold]: store it now, it is shown only once.")
    click.echo(token)
