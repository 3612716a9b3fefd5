"""The Graph API honours the proxy's authorization (issue 9 item 1): real hub, kas, agentk, cluster and kubectl.

The agent is configured with ``user_access: access_as: user``; developer ``alice`` is bound by RBAC to
read ConfigMaps in one namespace only. Through kas' ``/graph`` she sees exactly what ``kubectl get`` through
the same kas shows her, although agentk's own identity (cluster admin) sees every namespace and Secret.
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.test_k8s_proxy_session import register_agent, wait_for_tunnel
from tests.fixtures.hub import HubLauncher
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tests.graph.harness import GraphModel, include
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo, write_kubeconfig
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]

ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: configmap-reader, namespace: {ns}}}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-reads-configmaps, namespace: {ns}}}
subjects:
- {{kind: User, name: "gitlab:user:alice", apiGroup: rbac.authorization.k8s.io}}
roleRef: {{kind: Role, name: configmap-reader, apiGroup: rbac.authorization.k8s.io}}
"""


@pytest.fixture
def namespaces(kubectl: Kubectl) -> Iterator[tuple[str, str]]:
    """(namespace alice may read ConfigMaps in, namespace she may not), each with a ConfigMap and a Secret."""
    names = (f"t-{uuid.uuid4().hex[:10]}", f"t-{uuid.uuid4().hex[:10]}")
    for name in names:
        kubectl.run("create", "namespace", name)
        kubectl.run("-n", name, "create", "configmap", f"cm-{name}", "--from-literal=k=v")
        kubectl.run("-n", name, "create", "secret", "generic", f"sec-{name}", "--from-literal=password=hunter2")
    kubectl.run("apply", "-f", "-", input_text=ROLE.format(ns=names[0]))
    try:
        yield names
    finally:
        for name in names:
            kubectl.run("delete", "namespace", name, "--wait=false", check=False)


async def graph_of(kas: KasProc, token: str, request: dict[str, object]) -> GraphModel:
    """The graph a WebSocket client of ``kas`` receives until the initial state has settled."""
    assert kas.k8s_proxy_ca is not None
    context = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
    model = GraphModel()
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            kas.k8s_proxy_url + "graph",
            protocols=["gitlab-agent-graph-api"],
            headers={"Authorization": f"Bearer {token}"},
            ssl=context,
        )
        await ws.send_str(json.dumps(request))
        # The first message is the initial state (every watch synced or failed); take what follows briefly.
        message = await ws.receive(timeout=60)
        while message.type == aiohttp.WSMsgType.TEXT:
            model.apply(message.data.encode())
            try:
                message = await ws.receive(timeout=3)
            except TimeoutError:
                break
        await ws.close()
    return model


async def test_a_user_limited_to_one_namespace_sees_only_its_objects(
    hub_launcher: HubLauncher,
    k8s_cluster: ClusterInfo,
    kubectl: Kubectl,
    namespaces: tuple[str, str],
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    tmp_path: Path,
) -> None:
    allowed, forbidden = namespaces
    hub = hub_launcher.launch()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server, proxy_tls)  # type: ignore[arg-type]
    try:
        kas = system.kas()
        agent_id, agent_token, alice_token = register_agent(hub, "user")
        system.agentk(agent_token, kas)
        await wait_for_tunnel(system, kas, agent_id)
        token = f"pat:{agent_id}:{alice_token}"

        # What alice may `kubectl get` through the same kas.
        proxy_kubeconfig = tmp_path / "alice.kubeconfig"
        write_kubeconfig(proxy_kubeconfig, kas.k8s_proxy_url, token, kas.k8s_proxy_ca)
        alice = Kubectl(kubectl.binary, proxy_kubeconfig)
        listed = alice.json("-n", allowed, "get", "configmaps")
        visible = {(allowed, item["metadata"]["name"]) for item in listed["items"]}
        assert (allowed, f"cm-{allowed}") in visible
        for args in (("-n", forbidden, "get", "configmaps"), ("-n", allowed, "get", "secrets")):
            denied = alice.run(*args, check=False)
            assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied

        queries = [include("group == '' && resource in ['configmaps', 'secrets']")]
        model = await graph_of(kas, token, {"queries": queries, "namespaces": {"names": [allowed, forbidden]}})
        seen = {(k[3], k[4]) for k in model.vertices}
        assert seen == visible, f"graph {sorted(seen)} != kubectl {sorted(visible)}"
        assert all(k[2] == "configmaps" for k in model.vertices)
        cluster_wide = await graph_of(kas, token, {"queries": queries})
        assert not {k for k in cluster_wide.vertices if k[3] != allowed}, "nothing outside the allowed namespace"
        assert cluster_wide.warnings, "the cluster-wide watches alice may not run are reported"
        assert not any(b"hunter2" in raw or b"aHVudGVyMg" in raw for raw in model.raw + cluster_wide.raw)
    finally:
        system.stop_all()
