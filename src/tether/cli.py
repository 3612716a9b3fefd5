"""The ``tether`` command line: one console script with a sub-command per process and tool.

Sub-commands are imported on first use, so ``tether agentk`` loads agentk and nothing else (no hub, no
development environment). Commands whose dependencies come with an optional extra say which one to
install when it is missing.
"""

from __future__ import annotations

import importlib
import sys

import click

from tether import __version__

#: Command name -> (module, attribute, the extra that brings its dependencies or None).
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "kas": ("tether.kas.command", "kas_command", None),
    "agentk": ("tether.agentk.command", "agentk_command", None),
    "hub": ("tether.hub.command", "hub", "hub"),
    "graph": ("tether.modules.graph.client.command", "graph_command", "client"),
    "workspace": ("tether.modules.remote_development.client.command", "workspace_command", "client"),
    "up": ("tether.devenv.up", "up", "devenv"),
    "dev": ("tether.devenv.commands", "dev", "devenv"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, extra = COMMANDS[cmd_name]
        try:
            command = getattr(importlib.import_module(module), attribute)
        except ModuleNotFoundError as exc:
            if extra is None or (exc.name or "").startswith("tether"):
                raise
            return _missing_extra(cmd_name, extra, exc.name or "?")
        assert isinstance(command, click.Command)
        return command


def _missing_extra(cmd_name: str, extra: str, missing: str) -> click.Command:
    """A stand-in for a command whose optional dependencies are not installed: it says what to install."""
    install = f"pip install 'tether[{extra}]'"

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
    """Console-script entry point: runs :func:`cli`, turning set-up problems into a one-paragraph error."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        # Set-up problems can only come from the development environment, so it is only consulted once loaded.
        if "tether.devenv" not in sys.modules:
            raise
        from tether.devenv.commands import report_setup_problem  # noqa: PLC0415 (loaded only with devenv)

        if not report_setup_problem(exc):
            raise
        sys.exit(1)
