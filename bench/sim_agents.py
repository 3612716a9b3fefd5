"""Simulate many agents against one kas: per agent one GetConfiguration stream and two idle tunnels.

Usage: ``python bench/sim_agents.py <kas agent host:port> <token prefix> <count>``; tokens are
``<prefix><i>`` for i in 0..count-1. Runs until stdin closes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc
import uvloop

from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as config_pb2
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as config_grpc
from tether.pb.gitlab.agent.entity.entity_pb2 import AgentMeta
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2 as tunnel_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2_grpc as tunnel_grpc

CHANNELS = 20
DESCRIPTOR = tunnel_pb2.ConnectRequest(
    descriptor=tunnel_pb2.Descriptor(
        agent_descriptor=info_pb2.AgentDescriptor(
            services=[info_pb2.Service(name="gitlab.agent.pods.rpc.Pods", methods=[info_pb2.Method(name="GetPods")])]
        )
    )
)


async def tunnel_requests(stop: asyncio.Event) -> AsyncIterator[tunnel_pb2.ConnectRequest]:
    yield DESCRIPTOR
    await stop.wait()


async def hold(call: grpc.aio.Call) -> None:
    try:
        async for _ in call:  # type: ignore[attr-defined]
            pass
    except grpc.aio.AioRpcError:
        pass


async def main() -> None:
    target, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stop = asyncio.Event()
    options = [("grpc.keepalive_time_ms", 55_000), ("grpc.keepalive_permit_without_calls", 1)]
    channels = [grpc.aio.insecure_channel(target, options=[*options, ("grpc.channel_id", i)]) for i in range(CHANNELS)]
    calls = []
    for i in range(count):
        channel = channels[i % CHANNELS]
        metadata = (("authorization", f"Bearer {prefix}{i}"),)
        request = config_pb2.ConfigurationRequest(agent_meta=AgentMeta(version="sim", pod_name=f"sim-{i}"))
        calls.append(config_grpc.AgentConfigurationStub(channel).GetConfiguration(request, metadata=metadata))
        for _ in range(2):
            calls.append(tunnel_grpc.ReverseTunnelStub(channel).Connect(tunnel_requests(stop), metadata=metadata))
        if i % 100 == 99:
            await asyncio.sleep(0.05)  # spread the connection storm a little, as a rollout would
    holders = [asyncio.create_task(hold(c)) for c in calls]
    print("started", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    stop.set()
    for call in calls:
        call.cancel()
    await asyncio.gather(*holders, return_exceptions=True)


if __name__ == "__main__":
    uvloop.run(main())
