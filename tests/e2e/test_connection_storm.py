"""A burst of RPCs on kas' agent listener is served, not cancelled (issue 9: stream re-opens at scale).

When thousands of agents connect together, their RPCs reach gRPC Core faster than kas' event loop picks them
up. Core's default backlog limits (1,000 waiting calls, random early rejection up to 3,000) then cancelled the
excess: tunnels ended ``CANCELLED`` within a second of opening and agentk had to re-open them
(``bench/hardening.py``: about 2 per agent at 10,000 agents). kas raises the limits
(:data:`tether.tool.grpc_stream.PENDING_RPC_OPTIONS`); here one client opens 3,000 tunnels at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.system import System
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2 as tunnel_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2_grpc as tunnel_grpc
from tether.tool.grpc_stream import CallWriter

pytestmark = [pytest.mark.redis]

TUNNELS = 3000
DESCRIPTOR = tunnel_pb2.ConnectRequest(
    descriptor=tunnel_pb2.Descriptor(
        agent_descriptor=info_pb2.AgentDescriptor(
            services=[info_pb2.Service(name="gitlab.agent.pods.rpc.Pods", methods=[info_pb2.Method(name="GetPods")])]
        )
    )
).SerializeToString()


async def test_a_burst_of_tunnels_is_served_not_cancelled(system: System, kas_hub: RealHub) -> None:
    token = "storm-agent-token"
    kas_hub.add_agent(token, 760, 76)
    limits = {"max_tunnels_per_agent": TUNNELS, "max_tunnels_per_connection": TUNNELS}
    kas = system.kas(use_redis=False, agent={"listen": limits})
    metadata = (("authorization", f"Bearer {token}"),)
    ended: Counter[str] = Counter()

    async def tunnel(stub: tunnel_grpc.ReverseTunnelStub) -> None:
        call = stub.Connect(metadata=metadata)
        try:
            await CallWriter(call).write(DESCRIPTOR)
            while await call.read() is not grpc.aio.EOF:
                pass
            ended[(await call.code()).name] += 1
        except grpc.aio.AioRpcError as exc:
            ended[exc.code().name] += 1

    async with grpc.aio.insecure_channel(kas.agent_address.removeprefix("grpc://")) as channel:
        stub = tunnel_grpc.ReverseTunnelStub(channel)
        await channel.channel_ready()
        # Authenticate once, so the burst below is about the listener, not the hub.
        warm = asyncio.create_task(tunnel(stub))
        for _ in range(200):
            if kas.gauge("tunnels_idle") >= 1 or ended:
                break
            await asyncio.sleep(0.1)
        assert kas.gauge("tunnels_idle") == 1, dict(ended)
        tasks = [asyncio.create_task(tunnel(stub)) for _ in range(TUNNELS - 1)]
        deadline = time.monotonic() + 120
        while kas.gauge("tunnels_idle") < TUNNELS and not ended:
            assert time.monotonic() < deadline, f"{kas.gauge('tunnels_idle')} tunnels idle"
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # a cancelled tunnel would show by now
        assert not ended, f"tunnels ended during the burst: {dict(ended)}"
        assert kas.gauge("tunnels_idle") == TUNNELS
        for task in [warm, *tasks]:
            task.cancel()
        await asyncio.gather(warm, *tasks, return_exceptions=True)
