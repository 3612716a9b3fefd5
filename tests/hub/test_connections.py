"""The agent resource shows live connections from kas' agent tracker, and still answers when kas is down."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System
from tests.hub.helpers import project_with_agent
from tests.support.polling import poll_sync
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as config_pb2
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as config_grpc
from tether.pb.gitlab.agent.entity.entity_pb2 import AgentMeta
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer


def test_agent_resource_answers_when_kas_is_unreachable(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch({"kas.api_address": f"127.0.0.1:{free_port()}", "kas.timeout": "2s"})
    setup = project_with_agent(hub, roles=())
    response = hub.api().get(f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}")
    assert response.status_code == 200
    body = response.json()
    assert body["connections"] == [] and "kas unavailable" in body["connections_error"]


@pytest.mark.redis
def test_agent_resource_lists_connections_from_a_real_kas(
    hub_launcher: HubLauncher, tmp_path: Path, private_secret_file: Path, redis_server: RedisServer
) -> None:
    hub = hub_launcher.prepare()
    system = System(tmp_path / "system", hub, private_secret_file, None, redis_server)  # type: ignore[arg-type]
    (tmp_path / "system").mkdir()
    try:
        kas = system.kas()
        hub_launcher.start(hub, {"kas.api_address": kas.api_target})
        setup = project_with_agent(hub, roles=())
        tokens = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
        token = hub.api().post(tokens, json={"name": "t"}).json()["token"]
        agent_url = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}"
        assert hub.api().get(agent_url).json()["connections"] == []

        async def connect_and_check() -> None:
            meta = AgentMeta(version="v9.9.9", commit_id="abc", pod_namespace="ns", pod_name="pod-1")
            async with grpc.aio.insecure_channel(kas.agent_address.removeprefix("grpc://")) as channel:
                stream = config_grpc.AgentConfigurationStub(channel).GetConfiguration(
                    config_pb2.ConfigurationRequest(agent_meta=meta),
                    metadata=(("authorization", f"Bearer {token}"),),
                )
                first = await stream.read()
                assert first.configuration.agent_id == setup.agent_id

                def listed() -> list[dict[str, object]]:
                    return list(hub.api().get(agent_url).json()["connections"])

                connections = await asyncio.to_thread(poll_sync, listed, "the connection to be listed", 15)
                assert len(connections) == 1
                conn = connections[0]
                assert (conn["agent_version"], conn["pod_name"], conn["pod_namespace"]) == ("v9.9.9", "pod-1", "ns")
                assert conn["connection_id"] and conn["connected_at"]
                assert conn["kas_url"] == kas.private_url  # the kas replica holding the connection
                assert hub.api().get(agent_url).json()["connections_error"] is None
                stream.cancel()

        asyncio.run(connect_and_check())
        poll_sync(lambda: hub.api().get(agent_url).json()["connections"] == [], "the connection to go away", 15)
    finally:
        system.stop_all()
