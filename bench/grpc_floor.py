"""What grpcio itself costs a server per idle connection and per idle stream, without any Tether code.

Usage: ``uv run python bench/grpc_floor.py [--connections 2000]``

A bare ``grpc.aio`` server (kas' pending-call options, a raw stream-stream method whose handler only waits)
and a client process that opens ``--connections`` channels, each on its own HTTP/2 connection, with 0, 1 and
3 streams each (3 is what an agent holds on kas: its configuration stream and two idle tunnels). The server's
``VmRSS`` growth is read 5 s after every stream is open. It is the floor under ``kas_rss_10000_agents_mib``
(issue 9): what kas adds per agent on top of it is Tether's. Each figure is measured twice, side by side: with
grpcio's default channel arguments, and with kas' (no Core message-size limit, checked in Python instead by
:mod:`tether.tool.grpc_size`, and channelz off). Prints the figures; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import uvloop

from tether.tool.grpc_size import unlimited_size_options

METHOD = "/floor.Floor/Wait"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def wait_forever(_requests: Any, _context: Any) -> None:
    """Hold the stream open, as kas holds an idle tunnel."""
    await asyncio.Event().wait()


def _variant_options(variant: str) -> list[tuple[str, int]]:
    if variant == "default":
        return []
    return [*unlimited_size_options(), ("grpc.enable_channelz", 0)]  # as kas' listeners


async def serve(connections: int, streams: int, variant: str) -> float:
    """KiB of server RSS per connection holding ``streams`` idle streams (``variant``: default or kas)."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.server.max_pending_requests", 20_000),
            ("grpc.server.max_pending_requests_hard_limit", 50_000),
            *_variant_options(variant),
        ]
    )
    handler = grpc.stream_stream_rpc_method_handler(wait_forever)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("floor.Floor", {"Wait": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.sleep(1)
    before = rss_mib()
    client = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", str(port), str(connections), str(streams), stdout=subprocess.PIPE
    )
    assert client.stdout is not None
    await client.stdout.readline()  # every stream open
    await asyncio.sleep(5)
    growth = rss_mib() - before
    client.kill()
    await client.wait()
    await server.stop(None)
    return growth * 1024 / connections


async def hold(port: int, connections: int, streams: int) -> None:
    """The client: ``connections`` channels (distinct arguments, so distinct connections) with open streams."""
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) for i in range(connections)
    ]
    calls = []
    for channel in channels:
        await channel.channel_ready()
        for _ in range(streams):
            call = channel.stream_stream(METHOD)()
            await call.write(b"x")
            calls.append(call)
    await asyncio.sleep(2)
    print("open", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        uvloop.run(hold(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
        return
    if sys.argv[1:2] == ["--server"]:  # a fresh process per figure: freed memory of an earlier one is not reused
        per = uvloop.run(serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
        print(
            f"{sys.argv[4]:>7} options, {sys.argv[2]} connections x {sys.argv[3]} streams: "
            f"{per:.1f} KiB per connection",
            flush=True,
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    args = parser.parse_args()
    for streams in (0, 1, 3):
        for variant in ("default", "kas"):
            command = [sys.executable, __file__, "--server", str(args.connections), str(streams), variant]
            subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
