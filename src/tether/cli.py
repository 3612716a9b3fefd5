"""The ``tether`` command line: one console script with a sub-command per process and tool.

Sub-commands are imported on first use, so ``tether agentk`` loads agentk and nothing else (no hub, no
development environment). Commands whose dependencies are not installed say what to install: an optional
extra, or for ``up`` and ``dev`` the development environment, its own package (``devenv/`` in the
repository, never in the runtime wheel).
"""

from __future__ import annotations

import importlib
import sys

import click

from tether import __version__
from tether.tool.grpc_core import select_io_engine

_HUB = "pip install 'tether[hub]'"
_CLIENT = "pip install 'tether[client]'"
_DEVENV = "pip install -e ./devenv (in a Tether clone; `make up` installs it)"
#: Command name -> (module, attribute, what installs its dependencies, or None: they come with the package).
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "kas": ("tether.kas.command", "kas_command", None),
    "agentk": ("tether.agentk.command", "agentk_command", None),
    "hub": ("tether.hub.command", "hub", _HUB),
    "graph": ("tether.modules.graph.client.command", "graph_command", _CLIENT),
    "workspace": ("tether.modules.remote_development.client.command", "workspace_command", _CLIENT),
    "up": ("tether_devenv.up", "up", _DEVENV),
    "dev": ("tether_devenv.commands", "dev", _DEVENV),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, install = COMMANDS[cmd_name]
        try:
            command = getattr(importlib.import_module(module), attribute)
        except ModuleNotFoundError as exc:
            missing = exc.name or "?"
            if install is None or missing == "tether" or missing.startswith("tether."):
                raise  # a module of the runtime package itself: a broken installation, not a missing extra
            return _missing_extra(cmd_name, install, missing)
        assert isinstance(command, click.Command)
        return command


def _missing_extra(cmd_name: str, install: str, missing: str) -> click.Command:
    """A stand-in for a command whose optional dependencies are not installed: it says what to install."""

    def fail() -> None:
        raise click.ClickException(f"`tether {cmd_name}` needs the optional dependency {missing!r}: {install}")

    return click.Command(
        cmd_name,
        callback=fail,
        short_help=f"(not installed: {install})",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tether")
def cli() -> None:
    """Tether: kas, agentk and the hub, an agent system for Kubernetes wire-compatible with GitLab's agent."""


def main() -> None:
    """Console-script entry point: runs :func:`cli`, turning set-up problems into a one-paragraph error.

    gRPC Core's I/O engine is chosen first, before any command imports grpcio (:mod:`tether.tool.grpc_core`).
    """
    select_io_engine()
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        # Set-up problems can only come from the development environment, so it is only consulted once loaded.
        if "tether_devenv" not in sys.modules:
            raise
        from tether_devenv.commands import report_setup_problem  # noqa: PLC0415 (loaded only with devenv)

        if not report_setup_problem(exc):
            raise
        sys.exit(1)
