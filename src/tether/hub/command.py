"""``tether hub``: run the hub and administer its data.

``serve`` runs the HTTP service; ``migrate`` applies or reverts database migrations; the other sub-commands work
on the database directly as the operator (an administrator), for bootstrapping and scripting.

Sub-commands are imported on first use, so other ``tether`` commands do not pay for FastAPI and SQLAlchemy.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from tether.hub.cli.context import HubContext

#: Sub-command name -> (module, attribute).
SUBCOMMANDS = {
    "serve": ("tether.hub.cli.serving", "serve"),
    "migrate": ("tether.hub.cli.serving", "migrate"),
    "bootstrap": ("tether.hub.cli.people", "bootstrap"),
    "user": ("tether.hub.cli.people", "user_group"),
    "token": ("tether.hub.cli.people", "token_group"),
    "group": ("tether.hub.cli.projects", "group_group"),
    "project": ("tether.hub.cli.projects", "project_group"),
    "member": ("tether.hub.cli.projects", "member_group"),
    "agent": ("tether.hub.cli.agents", "agent_group"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module, attribute = SUBCOMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group("hub", cls=_LazyGroup)
@click.option(
    "-c",
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="TETHER_HUB_CONFIG",
    help="Configuration file (YAML; see docs/hub.md). Env: TETHER_HUB_CONFIG.",
)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help="Overrides data_dir.")
@click.option("--database-url", help="Overrides database.url, e.g. postgresql+asyncpg://user@host:5432/hub.")
@click.pass_context
def hub(ctx: click.Context, config_file: Path | None, data_dir: Path | None, database_url: str | None) -> None:
    """The hub: Tether's control plane (users, projects, agents, tokens, agent configuration).

    Without options it keeps its data in ~/.local/share/tether (SQLite file hub.db, generated secret
    gitlab_secret). TETHER_HUB_* environment variables override the configuration file.
    """
    ctx.obj = HubContext(config_file, {"data_dir": data_dir, "database.url": database_url})
