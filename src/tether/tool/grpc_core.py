"""gRPC Core's I/O engine for kas, agentk and the hub: chosen before grpcio is imported (issue 28 item 2).

grpcio 1.85 moves every socket read and write of a channel or server to EventEngine's thread pool. Under
grpcio's asyncio API, each message then crosses three threads: an ``event_engine`` thread reads or writes
the socket, grpcio's poller thread takes the completion, and the event loop runs the coroutine. The
older I/O manager, still in grpcio behind three Core experiments, reads and writes the sockets in the
poller thread itself. Measured on one stream between two processes (``bench/grpc_engine.py``: 400-byte
messages, 3,000 round trips, 2 cores; docs/benchmarks.md "Change 12"), a round trip's p50 fell from 335-347
to 156-238 µs and the client's CPU per round trip from 195-208 to 95-173 µs; through kas and agentk a small
GET costs each process about a third less CPU and 29-43 % fewer context switches.

Core reads ``GRPC_EXPERIMENTS`` once, when grpcio is imported, so :func:`select_io_engine` must run first.
A ``GRPC_EXPERIMENTS`` set by the operator wins, an empty one included (grpcio's own defaults).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["LEGACY_IO_EXPERIMENTS", "select_io_engine"]

#: The experiments that put a channel's, a server's and every other endpoint's I/O on EventEngine, disabled.
LEGACY_IO_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def select_io_engine(environ: MutableMapping[str, str] = os.environ) -> str:
    """Disable EventEngine I/O in ``environ`` unless the operator chose the experiments.

    Args:
        environ: the environment to set ``GRPC_EXPERIMENTS`` in (the process' own by default; children inherit it).

    Returns:
        The value in force: :data:`LEGACY_IO_EXPERIMENTS`, or the operator's (possibly empty) string.

    Only effective before ``grpc`` is first imported in this process: Core reads the variable then (grpcio
    1.85 behaviour; an experiment a later grpcio no longer knows is logged and ignored). Raises nothing.
    """
    return environ.setdefault("GRPC_EXPERIMENTS", LEGACY_IO_EXPERIMENTS)
