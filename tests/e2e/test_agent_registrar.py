"""``AgentRegistrar.Register`` on Tether kas (issue 11): upstream's method and field numbers, one tracker entry per
pod refreshed by every call, clear refusals; and the pod disappears when its token is revoked."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis

from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System
from tests.hub.helpers import project_with_agent
from tests.support.polling import poll_sync
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as config_pb2
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as config_grpc
from tether.pb.gitlab.agent.agent_registrar.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.entity.entity_pb2 import AgentMeta
from tether.pb.gitlab.agent.redistool.redistool_pb2 import ExpiringValue
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.redis]


def test_register_wire_names_and_field_numbers_are_upstreams() -> None:
    service = rpc_pb2.DESCRIPTOR.services_by_name["AgentRegistrar"]
    assert service.full_name == "gitlab.agent.agent_registrar.rpc.AgentRegistrar"
    method = service.methods_by_name["Register"]
    assert (method.client_streaming, method.server_streaming) == (False, False)
    fields = {f.name: (f.number, f.type) for f in rpc_pb2.RegisterRequest.DESCRIPTOR.fields}
    assert fields == {"agent_meta": (1, 11), "pod_id": (2, 3)}  # message, int64
    assert rpc_pb2.RegisterResponse.DESCRIPTOR.fields == []


async def _entries(redis_url: str, prefix: str, agent_id: int) -> dict[int, tuple[int, ConnectedAgentInfo]]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        key = f"{prefix}:agent_tracker2:conn_by_agent_id:".encode() + struct.pack("<q", agent_id)
        raw = await client.hgetall(key)
    finally:
        await client.aclose()
    result = {}
    for field, value in raw.items():
        stored = ExpiringValue.FromString(value)
        result[int(field)] = (stored.expires_at, ConnectedAgentInfo.FromString(stored.value))
    return result


def test_register_writes_one_refreshed_entry_per_pod_and_refuses_bad_calls(
    hub_launcher: HubLauncher, tmp_path: Path, private_secret_file: Path, redis_server: RedisServer
) -> None:
    hub = hub_launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, None, redis_server)  # type: ignore[arg-type]
    try:
        kas = system.kas()
        hub_launcher.start(hub, {"kas.api_address": kas.api_target})
        setup = project_with_agent(hub, roles=())
        tokens = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
        created = hub.api().post(tokens, json={"name": "t"}).json()
        auth = (("authorization", f"Bearer {created['token']}"),)
        meta = AgentMeta(version="v16.5.0", commit_id="8daa08cc", pod_namespace="gitlab-agent", pod_name="pod-a")
        target = kas.agent_address.removeprefix("grpc://")

        async def scenario() -> None:
            async with grpc.aio.insecure_channel(target) as channel:
                register = rpc_pb2_grpc.AgentRegistrarStub(channel).Register
                await register(rpc_pb2.RegisterRequest(agent_meta=meta, pod_id=77), metadata=auth)
                first = await _entries(redis_server.url, system.key_prefix, setup.agent_id)
                assert list(first) == [77] and first[77][1].agent_meta == meta
                assert first[77][1].project_id == setup.project_id
                await asyncio.sleep(1.1)
                await register(rpc_pb2.RegisterRequest(agent_meta=meta, pod_id=77), metadata=auth)
                again = await _entries(redis_server.url, system.key_prefix, setup.agent_id)
                assert list(again) == [77] and again[77][0] > first[77][0]  # same entry, later expiry
                assert again[77][0] > time.time() + 300  # outlives agentk's 5-minute cadence

                refusals = [
                    (rpc_pb2.RegisterRequest(agent_meta=meta, pod_id=78), (), grpc.StatusCode.UNAUTHENTICATED),
                    (
                        rpc_pb2.RegisterRequest(agent_meta=meta, pod_id=78),
                        (("authorization", "Bearer glagent-unknown"),),
                        grpc.StatusCode.UNAUTHENTICATED,
                    ),
                    (rpc_pb2.RegisterRequest(agent_meta=meta), auth, grpc.StatusCode.INVALID_ARGUMENT),
                    (
                        rpc_pb2.RegisterRequest(agent_meta=AgentMeta(pod_name="x" * 5000), pod_id=78),
                        auth,
                        grpc.StatusCode.INVALID_ARGUMENT,
                    ),
                ]
                for request, metadata, code in refusals:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await register(request, metadata=metadata)
                    assert refused.value.code() == code
                assert list(await _entries(redis_server.url, system.key_prefix, setup.agent_id)) == [77]

        asyncio.run(scenario())
        listed = hub.api().get(f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}").json()["connections"]
        assert [(c["connection_id"], c["pod_name"]) for c in listed] == [(77, "pod-a")]

        # A configuration stream of the agent (skip_register, as agentk does) learns of the revocation and
        # removes the pod's entry at once instead of leaving it to expire.
        def watch_configuration() -> None:
            with grpc.insecure_channel(target) as channel:
                stream = config_grpc.AgentConfigurationStub(channel).GetConfiguration(
                    config_pb2.ConfigurationRequest(agent_meta=meta, skip_register=True), metadata=auth, timeout=30
                )
                try:
                    for _ in stream:
                        hub.api().delete(f"{tokens}/{created['id']}")
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED

        watch_configuration()
        agent_url = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}"
        poll_sync(lambda: hub.api().get(agent_url).json()["connections"] == [], "the revoked pod's entry to go", 15)
    finally:
        system.stop_all()
