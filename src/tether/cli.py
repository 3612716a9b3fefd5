"""The ``tether`` command line: one console script with a sub-command per process and tool."""

from __future__ import annotations

import sys

import click

from tether import __version__
from tether.agentk.command import agentk_command
from tether.devenv.assets import AssetsMissing
from tether.devenv.build import BuildError
from tether.devenv.commands import console, dev, print_access, start_cluster, wait_for_exit
from tether.devenv.commands import default_cluster_dir as _default_cluster_dir
from tether.devenv.process import EnvironmentProblem
from tether.kas.command import kas_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tether")
def cli() -> None:
    """Tether: kas, agentk and the hub, an agent system for Kubernetes wire-compatible with GitLab's agent."""


@cli.command()
@click.option("--nodes", default=1, show_default=True, help="Number of kwok fake nodes in the local cluster.")
def up(nodes: int) -> None:
    """Run the whole system on embedded defaults; Ctrl-C stops everything.

    Today this starts the local Kubernetes cluster (building it once per machine if needed) and prints
    how to reach it; kas, agentk and the hub join as they are built.
    """
    local = start_cluster(_default_cluster_dir(), nodes, None)
    assert local.info is not None
    print_access(local.info)
    click.echo("Press Ctrl-C to stop.")
    wait_for_exit(local)


cli.add_command(dev)
cli.add_command(kas_command)
cli.add_command(agentk_command)


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
