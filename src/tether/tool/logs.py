"""Process logging: one event per line with a timestamp, level, logger and message (stdlib ``logging``)."""

from __future__ import annotations

import logging
import sys

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


def setup_logging(level: str = "info", grpc_level: str = "error") -> None:
    """Configure the root logger on stderr; ``level``/``grpc_level`` are kascfg names (info, debug, warn, error)."""
    logging.basicConfig(
        stream=sys.stderr,
        level=_LEVELS.get(level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    logging.getLogger("grpc").setLevel(_LEVELS.get(grpc_level, logging.ERROR))
