"""One logging set-up for kas, agentk and the hub (issue 9 item 6): one JSON object per line on stderr.

stdlib ``logging`` and ``structlog`` loggers render alike, with a timestamp, level, logger and event, any
``extra`` fields, and the context fields known where the line is written: ``agent_id``, ``connection_id``,
``kas_url`` and ``request_id``. Context comes from :func:`bind` (per task, through ``contextvars``) and from
:func:`set_process_fields` (the whole process, e.g. agentk's ``agent_id``). kas gives each request a
``request_id`` and passes it to agentk (gRPC metadata :data:`REQUEST_ID_METADATA`) and to the hub (HTTP header
:data:`REQUEST_ID_HEADER`), so one request can be followed across the three processes.

The ``connection_id`` of an agentk is the random pod id it registers with (``RegisterRequest.pod_id``,
upstream's connection id in the agent tracker, kas.md §3.3). agentk puts it on all its lines and sends it on
every call to kas (gRPC metadata :data:`CONNECTION_ID_METADATA`); kas binds it to everything it does on
behalf of that connection (tunnels, configuration stream, registrations), so kas and agentk lines of one
connection can be matched. It is informative only: authorization never depends on it.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog

__all__ = [
    "CONNECTION_ID_METADATA",
    "CONTEXT_FIELDS",
    "REQUEST_ID_HEADER",
    "REQUEST_ID_METADATA",
    "bind",
    "bind_for_task",
    "connection_id_from",
    "current_connection_id",
    "current_request_id",
    "new_request_id",
    "set_process_fields",
    "setup_logging",
]

#: The fields that tie log lines of one agent, connection and request together.
CONTEXT_FIELDS = ("agent_id", "connection_id", "kas_url", "request_id")
#: gRPC metadata key carrying the request id from kas to agentk.
REQUEST_ID_METADATA = "x-request-id"
#: HTTP header carrying the request id from kas to the hub.
REQUEST_ID_HEADER = "X-Request-Id"
#: gRPC metadata key carrying agentk's connection id (its pod id) on every call to kas.
CONNECTION_ID_METADATA = "x-connection-id"
_MAX_INT63 = 2**63 - 1

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING}
_LEVELS["error"] = logging.ERROR
_process_fields: dict[str, Any] = {}


def _add_process_fields(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in _process_fields.items():
        event.setdefault(key, value)
    return event


def set_process_fields(**fields: Any) -> None:
    """Add fields to every later line of this process (e.g. ``agent_id`` once agentk knows it)."""
    _process_fields.update(fields)


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (e.g. ``request_id``, ``agent_id``) to the lines of the current task and its children."""
    with structlog.contextvars.bound_contextvars(**{k: v for k, v in fields.items() if v is not None}):
        yield


def bind_for_task(**fields: Any) -> None:
    """Add ``fields`` to the rest of the current task's lines (e.g. a gRPC handler bound by an interceptor).

    Each RPC grpc.aio serves runs in a task of its own, so the fields end with it.
    """
    structlog.contextvars.bind_contextvars(**{k: v for k, v in fields.items() if v is not None})


def connection_id_from(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The connection id agentk sent in :data:`CONNECTION_ID_METADATA`, or None when absent or malformed.

    Only ASCII decimal digits for a value in 1..2^63-1 are accepted (a pod id is a random int63).
    """
    for key, value in metadata or ():
        if key == CONNECTION_ID_METADATA and isinstance(value, str):
            if value.isascii() and value.isdigit() and len(value) <= 19 and 0 < int(value) <= _MAX_INT63:
                return int(value)
            return None
    return None


def current_connection_id() -> int | None:
    """The ``connection_id`` bound in the current context, or None."""
    value = structlog.contextvars.get_contextvars().get("connection_id")
    return value if isinstance(value, int) else None


def new_request_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    """The ``request_id`` bound in the current context, or None."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return str(value) if value is not None else None


def _level(name: str) -> int:
    level = _LEVELS.get(name.lower())
    if level is None:
        raise ValueError(f"unknown log level {name!r}")
    return level


def setup_logging(level: str = "info", grpc_level: str = "error") -> None:
    """Configure the root logger and structlog: JSON lines on stderr at ``level``.

    Args:
        level: ``debug``, ``info``, ``warn``/``warning`` or ``error``.
        grpc_level: the same, for grpcio's own logger.

    Raises:
        ValueError: an unknown level.
    """
    numeric = _level(level)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_process_fields,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    logging.getLogger("grpc").setLevel(_level(grpc_level))
