"""The Graph API through the real system: WebSocket at kas 1's ``/k8s-proxy/graph``, agentk on kas 2."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest

from tests.fixtures.hub_stub import HubStub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tests.graph.harness import GraphModel, include
from tether.devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.redis]
AGENT_ID, PROJECT_ID = 701, 70


async def test_graph_websocket_through_two_kas(
    system: System, k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, hub_stub: HubStub
) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", "first")
    token, pat = "graph-agent-token", "graph-user-pat"
    hub_stub.add_agent(token, AGENT_ID, PROJECT_ID)
    hub_stub.grant_proxy_access(pat, "viewer", AGENT_ID, PROJECT_ID)
    kas1, kas2 = system.kas(), system.kas()
    system.agentk(token, kas2)
    assert kas1.k8s_proxy_ca is not None
    context = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
    request = {"queries": [include("resource == 'configmaps'")], "namespaces": {"names": [k8s_namespace]}}
    headers = {"Authorization": f"Bearer pat:{AGENT_ID}:{pat}"}
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            kas1.k8s_proxy_url + "graph", protocols=["gitlab-agent-graph-api"], headers=headers, ssl=context
        )
        assert ws.protocol == "gitlab-agent-graph-api"
        await ws.send_str(json.dumps(request))
        model = GraphModel()
        while model.find("configmaps", "first", k8s_namespace) is None:
            message = await ws.receive(timeout=60)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            model.apply(message.data.encode())
        kubectl.run("-n", k8s_namespace, "create", "configmap", "second")
        while model.find("configmaps", "second", k8s_namespace) is None:
            message = await ws.receive(timeout=60)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            model.apply(message.data.encode())
        await ws.close()


async def test_graph_endpoint_requires_credentials(system: System, hub_stub: HubStub) -> None:
    kas1 = system.kas(use_redis=False)
    assert kas1.k8s_proxy_ca is not None
    context = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
    async with aiohttp.ClientSession() as http, http.get(kas1.k8s_proxy_url + "graph", ssl=context) as resp:
        assert resp.status == 401
        assert (await resp.json())["kind"] == "Status"
