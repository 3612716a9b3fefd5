"""``tether kas``: run one kas instance from a kascfg-style YAML file."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import click
import uvloop

from tether.kas.app import KasApp, KasStartError
from tether.kas.config import ConfigError, load_config
from tether.tool.logs import setup_logging


async def _run(config_file: Path) -> None:
    config = load_config(config_file)
    setup_logging(config.observability.logging.level, config.observability.logging.grpc_level)
    app = KasApp(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    try:
        await stop.wait()
    finally:
        await app.stop()


@click.command("kas")
@click.option(
    "--configuration-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="kas configuration (YAML, upstream kascfg field names; see docs/configuration.md).",
)
def kas_command(configuration_file: Path) -> None:
    """Run the agent server (kas): agent, api, private api and observability listeners.

    Without a `redis` section the state lives in memory (a single kas); with one, several kas replicas
    share it and route requests to each other. SIGTERM stops it cleanly.
    """
    try:
        uvloop.run(_run(configuration_file))
    except (ConfigError, KasStartError) as exc:
        raise click.ClickException(str(exc)) from exc
