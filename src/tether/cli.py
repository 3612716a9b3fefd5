"""The ``tether`` command line: one console script with a sub-command per process and tool."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tether import __version__
from tether.agentk.command import agentk_command
from tether.devenv.assets import AssetsMissing
from tether.devenv.build import BuildError
from tether.devenv.commands import console, dev
from tether.devenv.process import EnvironmentProblem
from tether.hub.command import hub
from tether.hub.workspaces.command import workspace_command
from tether.kas.command import kas_command
from tether.modules.graph.command import graph_command
from tether.up import UpOptions, run_up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tether")
def cli() -> None:
    """Tether: kas, agentk and the hub, an agent system for Kubernetes wire-compatible with GitLab's agent."""


@cli.command()
@click.option("--replicas", default=1, show_default=True, help="Number of kas replicas (2+ needs --redis).")
@click.option(
    "--redis", "redis_url", default=None, help="Redis URL shared by the kas replicas, e.g. redis://127.0.0.1:6379/0."
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the hub database, secrets, configs and logs live (default: ~/.local/share/tether/up).",
)
def up(replicas: int, redis_url: str | None, state_dir: Path | None) -> None:
    """Run the whole system on embedded defaults; Ctrl-C stops everything.

    Starts the local Kubernetes cluster (unless KUBECONFIG names one; the binaries are built once per
    machine), the hub on SQLite, kas and agentk, registers a demo project and agent, then prints a
    kubeconfig whose server is kas' Kubernetes API proxy.
    """
    kubeconfig = os.environ.get("KUBECONFIG")
    options = UpOptions(
        state_dir=state_dir or Path("~/.local/share/tether/up").expanduser(),
        replicas=replicas,
        redis_url=redis_url,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
    )

    def show(lines: dict[str, str]) -> None:
        click.echo()
        for label, value in lines.items():
            click.echo(f"{label + ':':28s} {value}")
        click.echo("\nPress Ctrl-C to stop.")

    run_up(options, lambda line: console.print(f"[dim]{line}[/dim]"), show)


cli.add_command(dev)
cli.add_command(kas_command)
cli.add_command(agentk_command)
cli.add_command(hub)
cli.add_command(graph_command)
cli.add_command(workspace_command)


def main() -> None:
    """Console-script entry point: runs :func:`cli`, turning set-up problems into a one-paragraph error."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (EnvironmentProblem, AssetsMissing, BuildError) as exc:
        console.print(f"[bold red]error:[/bold red] {exc}", markup=True)
        sys.exit(1)
