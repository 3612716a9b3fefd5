"""End to end with real kas and agentk on the real cluster: an agent registered through the hub's REST API
connects with its token, the agent resource shows the connection, and a revoked token is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.fixtures.hub import HubLauncher
from tests.fixtures.k8s import ClusterInfo
from tests.fixtures.system import System
from tests.support.polling import poll_sync
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as config_pb2
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as config_grpc
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]


def configuration_status(target: str, token: str) -> grpc.StatusCode:
    """Open a fresh GetConfiguration stream with ``token``; OK once a configuration arrives, else the error."""
    with grpc.insecure_channel(target) as channel:
        stream = config_grpc.AgentConfigurationStub(channel).GetConfiguration(
            config_pb2.ConfigurationRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=10
        )
        try:
            for _response in stream:
                stream.cancel()
                return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return grpc.StatusCode.OK
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.UNKNOWN


def test_agent_registered_through_rest_connects_and_revocation_refuses_it(
    tmp_path: Path, k8s_cluster: ClusterInfo, redis_server: RedisServer, private_secret_file: Path
) -> None:
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server)  # type: ignore[arg-type]
    try:
        kas = system.kas()
        launcher.start(hub, {"kas.api_address": kas.api_target})
        gl = hub.gitlab()
        project = gl.projects.create({"name": "clusters"})
        agent = project.cluster_agents.create({"name": "e2e"})
        tokens = f"/projects/{project.id}/cluster_agents/{agent.id}/tokens"
        created = gl.http_post(tokens, post_data={"name": "agentk"})
        token = created["token"]
        gl.http_put(
            f"/projects/{project.id}/cluster_agents/{agent.id}/configuration",
            raw=True,
            post_data=b"observability:\n  logging:\n    level: debug\n",
        )
        agent_api = f"/projects/{project.id}/cluster_agents/{agent.id}"

        agentk = system.agentk(token, kas)

        def connections() -> list[dict[str, Any]]:
            return list(hub.api().get(agent_api).json()["connections"])

        live = poll_sync(connections, "agentk's connection in the agent resource", 60)
        assert len(live) == 1
        assert (live[0]["pod_name"], live[0]["pod_namespace"]) == (agentk.name, "tether-system")
        assert live[0]["agent_version"] and live[0]["connected_at"]
        assert hub.api().get(agent_api).json()["connections_error"] is None
        poll_sync(lambda: gl.http_get(f"{tokens}/{created['id']}")["last_used_at"], "the token's last_used_at")

        target = kas.agent_address.removeprefix("grpc://")
        assert configuration_status(target, token) == grpc.StatusCode.OK
        gl.http_delete(f"{tokens}/{created['id']}")
        poll_sync(
            lambda: configuration_status(target, token) == grpc.StatusCode.UNAUTHENTICATED,
            "kas to refuse the revoked token (info cache TTL 1 s)",
            15,
            interval=0.5,
        )
        poll_sync(lambda: connections() == [], "the revoked agent's connection to end", 30)
    finally:
        system.stop_all()
        launcher.stop_all()


def test_a_revoked_token_is_cut_off_on_every_kas_at_once(
    tmp_path: Path, k8s_cluster: ClusterInfo, redis_server: RedisServer, private_secret_file: Path
) -> None:
    """Issue 9 item 7: with a 300 s info cache, revocation in the hub reaches every kas through Redis and
    closes that token's tunnels and configuration streams within 2 s (upstream waits for its cache)."""
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server)  # type: ignore[arg-type]
    long_cache = {"agent": {"info_cache_ttl": "300s", "info_cache_error_ttl": "300s"}}
    try:
        kas1, kas2 = system.kas(**long_cache), system.kas(**long_cache)
        launcher.start(hub, {"kas.api_address": kas1.api_target})  # the hub only knows kas 1
        gl = hub.gitlab()
        project = gl.projects.create({"name": "clusters"})
        agent = project.cluster_agents.create({"name": "revoked"})
        tokens = f"/projects/{project.id}/cluster_agents/{agent.id}/tokens"
        created = gl.http_post(tokens, post_data={"name": "agentk"})
        kept = gl.http_post(tokens, post_data={"name": "other"})
        token = created["token"]
        system.agentk(token, kas2)

        def tunnels() -> list[str]:
            return asyncio.run(system.tunnel_urls(agent.id))

        poll_sync(lambda: kas2.private_url in tunnels(), "agentk's tunnels on kas 2", 60)
        target = kas2.agent_address.removeprefix("grpc://")
        assert configuration_status(target, token) == grpc.StatusCode.OK  # cached on kas 2 for 300 s
        assert configuration_status(target, kept["token"]) == grpc.StatusCode.OK
        gl.http_delete(f"{tokens}/{created['id']}")
        poll_sync(lambda: kas2.gauge("tunnels_idle") == 0, "kas 2 to close the revoked token's tunnels", 2.0)
        assert configuration_status(target, token) == grpc.StatusCode.UNAUTHENTICATED
        assert configuration_status(target, kept["token"]) == grpc.StatusCode.OK, "the agent's other token works"
        # agentk retries with the revoked token: no tunnel comes back, and kas 2 leaves the tracker once its
        # unregistration delay (5 s) has passed.
        poll_sync(lambda: kas2.private_url not in tunnels(), "kas 2 to leave the tunnel tracker", 15)
        assert kas2.gauge("tunnels_idle") == 0
    finally:
        system.stop_all()
        launcher.stop_all()
