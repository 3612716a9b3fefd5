"""Audit events of relayed requests, end to end (issue 25 item 1): real hub, two kas, agentk, kubectl, Redis.

kubectl and plain clients reach the cluster through kas 1 (agentk is connected to kas 2 only); each kind of
request kas relays must show up in the hub's ``audit_events`` table with the caller's identity, the identity used
at the cluster and the outcome, refused requests too. The spool test takes the hub away for a minute and kills
kas with SIGKILL in between: every event must arrive once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from tests.e2e.test_k8s_proxy import https_client, run, start_proxied, wait_for
from tests.e2e.test_k8s_proxy_upgrade import Endpoints, connect_agent, endpoints, kubectl_exec
from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tests.graph.harness import include
from tether.hub.kas_client import KasApiClient
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, mint
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.redis]
__all__ = ["endpoints"]  # the fixture, imported for the upgrade test
UNKNOWN_METHOD = "/tether.test.Audit/Unknown"


def events(hub: RealHub, agent_id: int) -> list[dict[str, Any]]:
    """The stored events of ``agent_id``, oldest first."""
    return hub.db.rows("SELECT * FROM audit_events WHERE agent_id = :a ORDER BY time", a=agent_id)


async def wait_events(hub: RealHub, agent_id: int, match: Any, what: str, limit_s: float = 30) -> dict[str, Any]:
    """The first stored event of ``agent_id`` for which ``match(row)`` holds, waiting for kas to ship it."""

    def find() -> dict[str, Any] | None:
        return next((row for row in events(hub, agent_id) if match(row)), None)

    found: dict[str, Any] = await wait_for(find, limit_s, what)
    return found


async def test_an_event_for_each_kind_of_relayed_request(
    system: System, k8s_cluster: ClusterInfo, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    proxied = await start_proxied(system, kas_hub, kubectl, tmp_path)
    agent_id, kas1 = proxied.agent_id, proxied.kas1
    pat, user_pat = f"glpat-audit-{agent_id}", f"glpat-audit-user-{agent_id}"
    kas_hub.grant_proxy_access(pat, "auditor", agent_id, proxied.project_id)
    kc = proxied.kubectl(proxied.pat(pat), "auditor", k8s_namespace)
    await run(kubectl, "run", "audited", "-n", k8s_namespace, "--image=registry.invalid/x:1", "--restart=Never")

    # A list as the agent, and one as an impersonated user.
    await run(kc, "get", "configmaps")
    listed = await wait_events(
        kas_hub, agent_id, lambda r: r["resource"] == "configmaps" and r["username"] == "auditor", "the list"
    )
    assert (listed["kind"], listed["verb"], listed["status"], listed["namespace"]) == (
        "kubernetes_api",
        "list",
        200,
        k8s_namespace,
    )
    assert (listed["api_group"], listed["api_version"], listed["token_kind"], listed["identity_kind"]) == (
        "",
        "v1",
        "personal_access",
        "agent",
    )
    assert listed["kas_instance"] == kas1.private_url and listed["user_id"] > 0 and listed["bytes_out"] > 0
    assert listed["source_address"] == "127.0.0.1" and listed["request_id"] and listed["duration_ms"] > 0
    assert listed["path"] == f"/api/v1/namespaces/{k8s_namespace}/configmaps"
    assert user_pat not in json.dumps(events(kas_hub, agent_id), default=str)
    tokens = kas_hub.db.rows("SELECT id FROM personal_access_tokens WHERE user_id = :u", u=listed["user_id"])
    assert listed["token_id"] in {row["id"] for row in tokens}, "the id of the token used, never the token"

    # Refused: an unknown token (401, no user), with the agent and the kind of token it named.
    refused = proxied.kubectl(proxied.pat("glpat-not-a-token"), "nobody", k8s_namespace)
    assert (await run(refused, "get", "secrets", check=False)).returncode != 0
    denied = await wait_events(kas_hub, agent_id, lambda r: r["status"] == 401, "the refused request")
    assert (denied["user_id"], denied["token_kind"], denied["resource"]) == (0, "personal_access", "secrets")

    headers = {"Authorization": f"Bearer pat:{agent_id}:{pat}"}
    base = f"{kas1.k8s_proxy_url}api/v1/namespaces/{k8s_namespace}"
    async with https_client(kas1) as http:
        # A watch, ended by the API server after a second.
        async with http.get(f"{base}/configmaps?watch=true&timeoutSeconds=1", headers=headers) as resp:
            assert resp.status == 200
            await resp.read()
        # attach and port-forward: upgrade requests the API server answers without a kubelet.
        upgrade = {**headers, "Connection": "Upgrade", "Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": "x"}
        for sub in ("attach?stdout=true", "portforward?ports=80"):
            async with http.post(f"{base}/pods/audited/{sub}", headers=upgrade) as resp:
                await resp.read()
        # A Graph API session.
        ws = await http.ws_connect(kas1.k8s_proxy_url + "graph", protocols=["gitlab-agent-graph-api"], headers=headers)
        graph_request = json.dumps({"queries": [include("resource == 'configmaps'")]})
        await ws.send_str(graph_request)
        first_graph = await ws.receive(timeout=60)
        assert first_graph.type == aiohttp.WSMsgType.TEXT
        await ws.close()
    # kubectl exec: the API server switches protocols (101) and ends the session (kwok runs no container).
    await kubectl_exec(kc, "audited", "--", "true", websockets=True)
    # A routed gRPC call from the hub.
    client = KasApiClient(kas1.api_target, kas_hub.secret)
    try:
        await client.get_pods(agent_id, timeout_s=30)
    finally:
        await client.close()
    # Any agent method, routed by the ``kas-hop-routing-agent-id`` metadata; agentk does not offer this one, so no
    # tunnel is found before the call's deadline.
    jwt = mint(kas_hub.secret, ISSUER_GITLAB, AUDIENCE_KAS, 60)
    routed = (("authorization", f"Bearer {jwt}"), ("kas-hop-routing-agent-id", str(agent_id)))
    async with grpc.aio.insecure_channel(kas1.api_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await channel.unary_unary(UNKNOWN_METHOD)(b"ping", metadata=routed, timeout=1)
        assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    watch = await wait_events(kas_hub, agent_id, lambda r: r["verb"] == "watch", "the watch")
    assert (watch["resource"], watch["status"]) == ("configmaps", 200)
    for verb in ("attach", "portforward"):
        row = await wait_events(kas_hub, agent_id, lambda r, v=verb: r["verb"] == v, verb)
        assert (row["resource"], row["subresource"], row["name"]) == ("pods", verb, "audited")
    graph = await wait_events(kas_hub, agent_id, lambda r: r["kind"] == "graph", "the graph session")
    assert (graph["verb"], graph["status"], graph["username"]) == ("session", 101, "auditor")
    # The messages' bytes each way (kas serves the session itself: no relayed stream counts them).
    assert graph["bytes_in"] == len(graph_request.encode())
    assert graph["bytes_out"] >= len(first_graph.data.encode())
    exec_ = await wait_events(kas_hub, agent_id, lambda r: r["verb"] == "exec", "the exec")
    assert (exec_["status"], exec_["subresource"], exec_["name"]) == (101, "exec", "audited")
    assert exec_["bytes_out"] > 0
    pods = await wait_events(kas_hub, agent_id, lambda r: r["verb"].endswith("/GetPods"), "the GetPods call")
    assert (pods["kind"], pods["status"], pods["kas_instance"]) == ("grpc", 0, kas1.private_url)
    assert pods["bytes_out"] > 0
    generic = await wait_events(kas_hub, agent_id, lambda r: r["verb"] == UNKNOWN_METHOD, "the routed call")
    assert (generic["kind"], generic["status"]) == ("grpc", grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert 'tether_kas_audit_events_total{outcome="shipped"}' in kas1.metrics()

    # Last (it turns the project's access to access_as: user): a request as an impersonated user.
    kas_hub.grant_proxy_access(user_pat, "impersonated", agent_id, proxied.project_id, as_user=True)
    as_user = proxied.kubectl(proxied.pat(user_pat), "impersonated", k8s_namespace)
    await run(as_user, "get", "pod", "audited", check=False)
    impersonated = await wait_events(
        kas_hub, agent_id, lambda r: r["username"] == "impersonated", "the impersonated request"
    )
    assert (impersonated["identity_kind"], impersonated["identity_user"]) == ("impersonate", "gitlab:user:impersonated")
    assert "gitlab:user" in json.loads(impersonated["identity_groups"])
    assert (impersonated["verb"], impersonated["resource"], impersonated["name"]) == ("get", "pods", "audited")


async def test_an_upgraded_stream_counts_its_bytes_each_way(
    system: System, kas_hub: RealHub, endpoints: Endpoints, tmp_path: Path
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id = await connect_agent(system, kas_hub, kas2, f"http://127.0.0.1:{endpoints.ws_port}", tmp_path)
    pat = f"glpat-audit-ws-{agent_id}"
    kas_hub.grant_proxy_access(pat, "streamer", agent_id, 75)
    context = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
    big = bytes(range(256)) * 4096  # 1 MiB each way
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http,
        http.ws_connect(kas1.k8s_proxy_url + "ws", headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"}) as ws,
    ):
        assert await ws.receive_str() == "welcome"
        await ws.send_bytes(big)
        assert await ws.receive_bytes() == big[::-1]
    row = await wait_events(kas_hub, agent_id, lambda r: r["status"] == 101, "the WebSocket session")
    assert row["bytes_in"] >= len(big) and row["bytes_out"] >= len(big)
    assert (row["verb"], row["path"], row["username"]) == ("get", "/ws", "streamer")


class Outage:
    """A TCP forwarder to the hub that can be taken down (connections refused) and brought back on its port."""

    def __init__(self, hub_url: str) -> None:
        host_port = hub_url.split("//", 1)[1].rstrip("/")
        self._host, port = host_port.rsplit(":", 1)
        self._port = int(port)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._links):  # kas' kept-alive connections to the hub end too
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        self._links.update((writer, up_writer))
        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer), return_exceptions=True)
        finally:
            self._links.difference_update((writer, up_writer))


@contextlib.asynccontextmanager
async def hub_behind(hub: RealHub) -> AsyncIterator[Outage]:
    outage = Outage(hub.url)
    await outage.up()
    try:
        yield outage
    finally:
        with contextlib.suppress(AssertionError):
            await outage.down()


def spooled_ids(spool: Path) -> set[str]:
    found: set[str] = set()
    for path in spool.glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                found.add(json.loads(line)["id"])
    return found


async def test_nothing_lost_or_stored_twice_across_a_hub_outage_and_kill_9(
    system: System, k8s_cluster: ClusterInfo, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    agent_id, project_id = 7451, 745
    token = f"audit-spool-agent-{time.monotonic_ns()}"
    kas_hub.add_agent(token, agent_id, project_id, "audit-spool")
    pat = f"glpat-audit-spool-{time.monotonic_ns()}"
    kas_hub.grant_proxy_access(pat, "spooler", agent_id, project_id)
    spool = tmp_path / "audit-spool"
    async with hub_behind(kas_hub) as hub_link:
        overrides: dict[str, Any] = {
            "gitlab": {"address": f"http://127.0.0.1:{hub_link.port}"},
            "audit": {"spool_dir": str(spool), "flush_interval": "0.2s"},
            "agent": {"kubernetes_api": {"allowed_agent_cache_ttl": "600s"}, "info_cache_ttl": "600s"},
        }
        kas = system.kas(**overrides)
        system.agentk(token, kas, "audit-spool")
        headers = {"Authorization": f"Bearer pat:{agent_id}:{pat}"}
        url = f"{kas.k8s_proxy_url}api/v1/namespaces/{k8s_namespace}/configmaps"
        async with https_client(kas) as http:

            async def get() -> int:
                async with http.get(url, headers=headers) as resp:
                    await resp.read()
                    return resp.status

            await wait_for(lambda: get_ok(get), 30, "a first request through kas (tunnel up, credentials cached)")
            await wait_events(kas_hub, agent_id, lambda r: r["status"] == 200, "the first event, shipped")
            before = len(events(kas_hub, agent_id))

            await hub_link.down()
            outage_began = time.monotonic()
            statuses = [await get() for _ in range(20)]
            assert statuses == [200] * 20  # the cached authorization serves requests while the hub is away
        # Written to the spool at once (not held in memory until the hub returns).
        await wait_for(lambda: len(spooled_ids(spool)) >= 20, 30, "20 events in the spool")
        kas.signal(signal.SIGKILL)
        kas.wait_exit()

        # A new kas on the same spool, while the hub is still away: it keeps them.
        restarted = system.kas(**overrides)
        assert len(spooled_ids(spool)) >= 20
        await asyncio.sleep(max(0.0, 60 - (time.monotonic() - outage_began)))
        assert len(events(kas_hub, agent_id)) == before
        await hub_link.up()
        await wait_for(lambda: len(events(kas_hub, agent_id)) >= before + 20, 60, "the spooled events at the hub")
        await wait_for(lambda: not spooled_ids(spool), 30, "an empty spool")
    rows = events(kas_hub, agent_id)
    assert len(rows) == before + 20 and len({r["event_id"] for r in rows}) == len(rows)
    duplicates = kas_hub.db.rows(
        "SELECT event_id, COUNT(*) AS n FROM audit_events WHERE agent_id = :a GROUP BY event_id HAVING COUNT(*) > 1",
        a=agent_id,
    )
    assert duplicates == []
    assert 'tether_kas_audit_events_total{outcome="dropped"} 0.0' in restarted.metrics()


async def get_ok(get: Any) -> bool:
    with contextlib.suppress(aiohttp.ClientError):
        return bool(await get() == 200)
    return False
