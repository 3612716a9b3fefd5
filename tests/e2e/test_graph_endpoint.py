"""The Graph API through the real system: WebSocket at kas 1's ``/k8s-proxy/graph``, agentk on kas 2."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import TETHER, System
from tests.graph.harness import GraphModel, include
from tether_devenv.cluster import ClusterInfo, write_kubeconfig
from tether_devenv.process import free_port

pytestmark = [pytest.mark.k8s, pytest.mark.redis]
AGENT_ID, PROJECT_ID = 701, 70


async def test_graph_websocket_through_two_kas(
    system: System, k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, kas_hub: RealHub
) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", "first")
    token, pat = "graph-agent-token", "graph-user-pat"
    kas_hub.add_agent(token, AGENT_ID, PROJECT_ID)
    kas_hub.grant_proxy_access(pat, "viewer", AGENT_ID, PROJECT_ID)
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


async def test_graph_endpoint_requires_credentials(system: System, kas_hub: RealHub) -> None:
    kas1 = system.kas(use_redis=False)
    assert kas1.k8s_proxy_ca is not None
    context = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
    async with aiohttp.ClientSession() as http, http.get(kas1.k8s_proxy_url + "graph", ssl=context) as resp:
        assert resp.status == 401
        assert (await resp.json())["kind"] == "Status"


async def test_tether_graph_cli_prints_the_live_graph_and_serves_a_page(
    system: System, k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, kas_hub: RealHub, tmp_path: Path
) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", "shown")
    token, pat = "graph-cli-agent-token", "graph-cli-pat"
    kas_hub.add_agent(token, AGENT_ID + 1, PROJECT_ID)
    kas_hub.grant_proxy_access(pat, "viewer", AGENT_ID + 1, PROJECT_ID)
    kas1 = system.kas()
    system.agentk(token, kas1)
    kubeconfig = tmp_path / "proxy.kubeconfig"
    write_kubeconfig(kubeconfig, kas1.k8s_proxy_url, f"pat:{AGENT_ID + 1}:{pat}", kas1.k8s_proxy_ca)
    port = free_port()
    args = [TETHER, "graph", "--kubeconfig", str(kubeconfig), "--output", "json", "--namespace", k8s_namespace]
    args += ["--resource", "resource == 'configmaps'", "--serve", f"127.0.0.1:{port}"]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        model = GraphModel()
        assert proc.stdout is not None
        while model.find("configmaps", "shown", k8s_namespace) is None:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, (await proc.stderr.read()).decode() if proc.stderr else "no output"
            model.apply(line.strip())
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as page:
                assert page.status == 200 and "Live graph" in await page.text()
            async with http.get(f"http://127.0.0.1:{port}/events") as events:
                first = await asyncio.wait_for(events.content.readline(), 10)
                assert first.startswith(b"data: ") and b"shown" in first
    finally:
        proc.terminate()
        await proc.wait()


def test_tether_graph_cli_explains_missing_credentials() -> None:
    result = subprocess.run([TETHER, "graph"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "--kubeconfig" in result.stderr and "Traceback" not in result.stderr


async def test_seed_example_names_with_label_selector_applies_both(
    system: System, k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, kas_hub: RealHub
) -> None:
    """The seed's example request sends ``namespaces.names`` with ``label_selector``: kas accepts it (it closed
    with 1007 before, issue 27 item 8) and agentk watches only the listed namespaces that carry the label."""
    listed_labelled, listed_plain, unlisted_labelled = k8s_namespace, *(f"{k8s_namespace}-{s}" for s in ("p", "u"))
    try:
        for ns in (listed_plain, unlisted_labelled):
            kubectl.run("create", "namespace", ns)
        for ns in (listed_labelled, unlisted_labelled):
            kubectl.run("label", "namespace", ns, "app=my-app")
        for ns in (listed_labelled, listed_plain, unlisted_labelled):
            kubectl.run("-n", ns, "create", "configmap", "cm")
        token, pat = "graph-seed-agent-token", "graph-seed-pat"
        kas_hub.add_agent(token, AGENT_ID + 2, PROJECT_ID)
        kas_hub.grant_proxy_access(pat, "viewer", AGENT_ID + 2, PROJECT_ID)
        kas1 = system.kas()
        system.agentk(token, kas1)
        assert kas1.k8s_proxy_ca is not None
        context = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
        # The seed's example ("Client request"), with a query that matches what the test created and the
        # test's namespaces in ``names``; ``namespaces`` is the seed's shape field for field.
        request = {
            "queries": [
                {"exclude": {"resource_selector_expression": "group == 'apps' && resource == 'pods'"}},
                {
                    "include": {
                        "resource_selector_expression": "group == '' && version == 'v1' && resource == 'configmaps'",
                        "object": {
                            "label_selector": "",
                            "field_selector": "",
                            "object_selector_expression": "name == 'cm' || name == 'late'",
                            "json_path": "",
                        },
                    }
                },
            ],
            "namespaces": {
                "names": [listed_labelled, listed_plain],
                "label_selector": "app=my-app",
                "field_selector": "",
                "object_selector_expression": "",
            },
        }
        headers = {"Authorization": f"Bearer pat:{AGENT_ID + 2}:{pat}"}
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                kas1.k8s_proxy_url + "graph", protocols=["gitlab-agent-graph-api"], headers=headers, ssl=context
            )
            await ws.send_str(json.dumps(request))
            model = GraphModel()
            while model.find("configmaps", "cm", listed_labelled) is None:
                message = await ws.receive(timeout=60)
                assert message.type == aiohttp.WSMsgType.TEXT, (message, ws.close_code)
                model.apply(message.data.encode())
            # The first message holds every watched namespace's initial list; a later object in the selected
            # namespace shows that the stream went on without the others.
            kubectl.run("-n", listed_labelled, "create", "configmap", "late")
            while model.find("configmaps", "late", listed_labelled) is None:
                message = await ws.receive(timeout=60)
                assert message.type == aiohttp.WSMsgType.TEXT, (message, ws.close_code)
                model.apply(message.data.encode())
            await ws.close()
        assert {key[3] for key in model.vertices} == {listed_labelled}
    finally:
        for ns in (listed_plain, unlisted_labelled):
            kubectl.run("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
