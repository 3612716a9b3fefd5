"""A benchmark agent process: an embedded agent serving raw ``tether.bench.Bench`` methods through kas.

Methods (raw bytes, never decoded by kas):
* ``Echo`` (unary): returns the request.
* ``Download`` (unary request, streamed response): request = total bytes and chunk bytes as two 8-byte
  little-endian integers; the response is that many bytes in chunks.

Reads commands on stdin, one per line: ``connect <token> <kas host:port>`` starts an agent and prints
``connected <token> <unix time>`` when its first tunnel is up (for the wake-up benchmark).

It is agentk's code, so it runs gRPC Core with agentk's I/O engine (:mod:`tether.tool.grpc_core`), chosen
before grpcio is imported.
"""

from __future__ import annotations

from tether.tool.grpc_core import select_io_engine

select_io_engine()  # before grpcio is imported: Core reads its settings then

import asyncio
import gc
import struct
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

from tether.agentk.app import configure_logging
from tether.agentk.embedded import EmbeddedAgent


async def echo(request: bytes, _context: Any) -> bytes:
    return request


async def download(request: bytes, _context: Any) -> AsyncIterator[bytes]:
    total, chunk = struct.unpack("<qq", request)
    block = b"\x5a" * chunk
    sent = 0
    while sent < total:
        piece = block if total - sent >= chunk else block[: total - sent]
        yield piece
        sent += len(piece)


def handlers() -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    return {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Download": grpc.unary_stream_rpc_method_handler(download),
    }


async def connect(token: str, target: str, agents: list[EmbeddedAgent]) -> None:
    agent = EmbeddedAgent(target, token)
    agent.add_generic_handler("tether.bench.Bench", handlers())
    await agent.start()
    agents.append(agent)
    await agent.wait_first_tunnel()
    print(f"connected {token} {time.time():.6f}", flush=True)
    # Each agentk is a process of its own that freezes its start-up heap (tether.tool.memory); here one process
    # hosts every agent of the run, and without this a full collection walked all of them: 63-124 ms pauses at
    # wake-up rounds 45, 110 and 174 that were the whole of wakeup_p99_ms (issue 28 item 3).
    gc.freeze()


async def main() -> None:
    configure_logging("warning")
    agents: list[EmbeddedAgent] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = []
    while line := (await reader.readline()).decode().strip():
        command, *args = line.split()
        if command == "connect":
            tasks.append(asyncio.create_task(connect(args[0], args[1], agents)))
    for agent in agents:
        await agent.stop()


if __name__ == "__main__":
    uvloop.run(main())
