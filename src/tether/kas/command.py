"""``tether kas``: run one kas instance from a kascfg-style YAML file."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import click
import uvloop

from tether.kas.app import KasApp, KasStartError
from tether.kas.config import ConfigError, load_config
from tether.tool import tracing
from tether.tool.logs import setup_logging


async def _run(config_file: Path) -> None:
    config = load_config(config_file)
    setup_logging(config.observability.logging.level, config.observability.logging.grpc_level)
    app = KasApp(config)
    # Process-wide, so only the command turns it on (tests run several KasApp in one process without it).
    traced = config.observability.tracing
    try:
        tracing.setup("tether-kas", traced.otlp_endpoint, traced.sampler_ratio, app.own_url)
    except ValueError as exc:  # OTEL_EXPORTER_OTLP_ENDPOINT is not an http(s) URL
        raise ConfigError(f"tracing: {exc}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    try:
        await stop.wait()
    finally:
        await app.stop()
        tracing.shutdown()


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
