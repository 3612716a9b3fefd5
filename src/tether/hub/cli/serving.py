"""``tether hub serve`` and ``tether hub migrate``."""

from __future__ import annotations

import click

from tether.hub.cli.common import err_console, run
from tether.hub.cli.context import HubContext, pass_hub
from tether.hub.db import migrate as migrations
from tether.hub.db.engine import Database
from tether.hub.server import HubServer, HubStartError
from tether.tool import tracing
from tether.tool.logs import setup_logging


@click.command("serve")
@click.option("--listen", default=None, help="host:port to listen on (overrides listen).")
@click.option("--kas-api-address", default=None, help="kas' api listener host:port (overrides kas.api_address).")
@click.option("--auto-migrate/--no-auto-migrate", default=None, help="Apply pending migrations at start.")
@pass_hub
def serve(hub_ctx: HubContext, listen: str | None, kas_api_address: str | None, auto_migrate: bool | None) -> None:
    """Run the HTTP service: REST API under /api/v4, kas' internal API, OpenAPI at /openapi.json.

    SIGINT or SIGTERM stops it after the requests in flight.
    """
    overrides = {"listen": listen, "kas.api_address": kas_api_address, "database.auto_migrate": auto_migrate}
    config = hub_ctx.config(**overrides)
    setup_logging(config.logging.level)
    traced = config.observability.tracing
    try:
        tracing.setup("tether-hub", traced.otlp_endpoint, traced.sampler_ratio, config.external_url or config.listen)
    except ValueError as exc:  # OTEL_EXPORTER_OTLP_ENDPOINT is not an http(s) URL
        raise click.ClickException(f"tracing: {exc}") from exc
    try:
        run(HubServer(config).serve())
    except HubStartError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        tracing.shutdown()


@click.command("migrate")
@click.option("--revision", default="head", show_default=True, help="Upgrade to this revision.")
@click.option("--downgrade", "down_to", default=None, help="Instead, revert down to this revision (`base`: empty).")
@pass_hub
def migrate(hub_ctx: HubContext, revision: str, down_to: str | None) -> None:
    """Apply the database migrations (Alembic), or revert them with --downgrade."""
    config = hub_ctx.config()
    if config.database.url is None:
        config.data_dir.expanduser().mkdir(parents=True, exist_ok=True)

    async def go() -> str | None:
        db = Database(config.database_url)
        try:
            if down_to is not None:
                await migrations.downgrade(db.engine, down_to)
            else:
                await migrations.upgrade(db.engine, revision)
            return await migrations.current_revision(db.engine)
        finally:
            await db.close()

    current = run(go())
    err_console.print(f"database {config.database_url.split('@')[-1]} is at revision {current or 'base (empty)'}")
