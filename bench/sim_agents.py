"""Simulate many agents against one kas: per agent one GetConfiguration stream and two idle tunnels.

Usage: ``python bench/sim_agents.py <kas agent host:port> <token prefix> <count> [agents per connection]``;
tokens are ``<prefix><i>`` for i in 0..count-1. Prints ``configured`` once every agent's configuration stream
has brought its first configuration (what agentk's readiness waits for), runs until stdin closes, then prints
``ended <JSON>``: how many streams ended and were re-opened during the run, by kind (``tunnel``, ``config``)
and status (``OK`` when kas ended the stream normally, which counts too: every re-open does).

The simulator stands in for Tether agentks, so it runs gRPC Core with agentk's I/O engine
(:mod:`tether.tool.grpc_core`), chosen before grpcio is imported.
"""

from __future__ import annotations

from tether.tool.grpc_core import select_io_engine

select_io_engine()  # before grpcio is imported: Core reads its settings then

import asyncio
import json
import sys

import grpc
import uvloop

from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as config_pb2
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as config_grpc
from tether.pb.gitlab.agent.entity.entity_pb2 import AgentMeta
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2 as tunnel_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2_grpc as tunnel_grpc
from tether.tool.grpc_stream import CallWriter

#: Real agents each have their own connection; ten per connection keeps the simulator process small.
AGENTS_PER_CHANNEL = 10
DESCRIPTOR = tunnel_pb2.ConnectRequest(
    descriptor=tunnel_pb2.Descriptor(
        agent_descriptor=info_pb2.AgentDescriptor(
            services=[info_pb2.Service(name="gitlab.agent.pods.rpc.Pods", methods=[info_pb2.Method(name="GetPods")])]
        )
    )
)


ENDED: dict[str, int] = {}
CONFIGURED: set[int] = set()


def reopened(kind: str, reason: str, detail: str = "") -> None:
    """Count one stream that ended during the run and is re-opened, whatever ended it (the first of each
    kind and reason is described on stderr)."""
    key = f"{kind} {reason}"
    if key not in ENDED:
        print(f"{kind} stream ended: {reason} {detail}", file=sys.stderr, flush=True)
    ENDED[key] = ENDED.get(key, 0) + 1


async def keep_tunnel(
    stub: tunnel_grpc.ReverseTunnelStub, metadata: tuple[tuple[str, str], ...], stop: asyncio.Event
) -> None:
    """One idle tunnel, re-opened whenever it ends (however it ends), as agentk's pool does.

    The descriptor goes through :class:`~tether.tool.grpc_stream.CallWriter`, as in agentk: a write racing the
    stream's end must not hide the status kas ended it with.
    """
    while not stop.is_set():
        call = stub.Connect(metadata=metadata)
        try:
            await CallWriter(call).write(DESCRIPTOR.SerializeToString())
            while await call.read() is not grpc.aio.EOF:
                pass
            reason, detail = (await call.code()).name, ""
        except grpc.aio.AioRpcError as exc:
            reason, detail = exc.code().name, f"{exc.details()} {exc.debug_error_string()}"
        except Exception as exc:  # any other end is a re-open too, never a silent stop
            reason, detail = type(exc).__name__, str(exc)
        if stop.is_set():
            return
        reopened("tunnel", reason, detail)
        await asyncio.sleep(1.0)


async def keep_config(
    stub: config_grpc.AgentConfigurationStub,
    metadata: tuple[tuple[str, str], ...],
    i: int,
    count: int,
    stop: asyncio.Event,
) -> None:
    """The configuration stream, re-opened whenever it ends (with a status, OK included, or an error); agent
    ``i`` of ``count`` is configured at its first message."""
    request = config_pb2.ConfigurationRequest(agent_meta=AgentMeta(version="sim", pod_name=f"sim-{i}"))
    while not stop.is_set():
        call = stub.GetConfiguration(request, metadata=metadata)
        try:
            async for _ in call:
                if i not in CONFIGURED:
                    CONFIGURED.add(i)
                    if len(CONFIGURED) == count:
                        print("configured", flush=True)
            reason, detail = (await call.code()).name, ""
        except grpc.aio.AioRpcError as exc:
            reason, detail = exc.code().name, str(exc.details())
        except Exception as exc:  # any other end is a re-open too, never a silent stop
            reason, detail = type(exc).__name__, str(exc)
        if stop.is_set():
            return
        reopened("config", reason, detail)
        await asyncio.sleep(1.0)


async def main() -> None:
    target, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stop = asyncio.Event()
    options = [("grpc.keepalive_time_ms", 55_000), ("grpc.keepalive_permit_without_calls", 1)]
    per_channel = int(sys.argv[4]) if len(sys.argv) > 4 else AGENTS_PER_CHANNEL
    count_channels = max(1, count // per_channel)
    channels = [
        grpc.aio.insecure_channel(target, options=[*options, ("grpc.channel_id", i)]) for i in range(count_channels)
    ]
    holders = []
    for i in range(count):
        channel = channels[i % count_channels]
        metadata = (("authorization", f"Bearer {prefix}{i}"),)
        holders.append(
            asyncio.create_task(keep_config(config_grpc.AgentConfigurationStub(channel), metadata, i, count, stop))
        )
        for _ in range(2):
            holders.append(asyncio.create_task(keep_tunnel(tunnel_grpc.ReverseTunnelStub(channel), metadata, stop)))
        if i % 100 == 99:
            await asyncio.sleep(0.05)  # spread the connection storm a little, as a rollout would
    print("started", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    stop.set()
    for holder in holders:
        holder.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    print(f"streams ended and re-opened during the run: {ENDED}", file=sys.stderr, flush=True)
    print("ended " + json.dumps(ENDED), flush=True)


if __name__ == "__main__":
    uvloop.run(main())
