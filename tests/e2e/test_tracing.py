"""One trace across every hop, received by a real collector (issue 25 item 3).

Real kubectl -> kas 1's Kubernetes API proxy (routing kas) -> kas 2 (gateway kas, holding agentk's tunnel) ->
agentk -> the API server. The API server here is a small HTTP server that records the ``traceparent`` it gets,
so the test sees that agentk passed its own span on. Jaeger, built from its Go module
(``tether_devenv.jaeger``), receives OTLP/HTTP from the three processes: the two kas take the endpoint from
``observability.tracing.otlp_endpoint``, agentk from ``OTEL_EXPORTER_OTLP_ENDPOINT``. The test reads the trace
back over Jaeger's query API and checks each hop's span and its parent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from tests.e2e.test_k8s_proxy import proxy_kubeconfig, run
from tests.e2e.test_k8s_proxy_upgrade import connect_agent
from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl, cluster_assets
from tests.fixtures.system import System
from tether.hub.kas_client import KasApiClient
from tether.tool import tracing
from tether.tool.secrets import load_base64_secret
from tether.tool.tracing import ENDPOINT_ENV
from tether_devenv.jaeger import JaegerServer

pytestmark = [pytest.mark.redis]

_POD_PATH = "/api/v1/namespaces/default/pods/traced"


@pytest_asyncio.fixture
async def api_server() -> AsyncIterator[tuple[str, list[str]]]:
    """An API server stand-in: answers one pod and records each ``traceparent`` header it receives."""
    received: list[str] = []

    async def pod(request: web.Request) -> web.Response:
        received.append(request.headers.get("traceparent", ""))
        return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "traced"}})

    async def pods(request: web.Request) -> web.Response:
        received.append(request.headers.get("traceparent", ""))
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})

    app = web.Application()
    app.router.add_get(_POD_PATH, pod)
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


@pytest.fixture
def jaeger(tmp_path: Path) -> Any:
    directory = tmp_path / "jaeger"
    directory.mkdir()
    server = JaegerServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _whole_trace(jaeger: JaegerServer, trace_id: str, services: int) -> dict[str, Any]:
    """The trace once spans of ``services`` processes (a kas counts once per instance) and 5 spans are stored."""
    deadline = time.monotonic() + 60
    while True:
        trace = await asyncio.to_thread(jaeger.trace, trace_id)
        if trace is not None and len(trace["processes"]) >= services and len(trace["spans"]) >= 5:
            return trace
        assert time.monotonic() < deadline, f"trace {trace_id} incomplete in Jaeger: {trace}"
        await asyncio.sleep(0.3)


def _instance(process: dict[str, Any]) -> str:
    return next((t["value"] for t in process["tags"] if t["key"] == "service.instance.id"), "")


async def test_one_trace_from_kubectl_or_the_hub_through_both_kas_and_agentk_to_the_api_server(
    system: System,
    kas_hub: RealHub,
    jaeger: JaegerServer,
    api_server: tuple[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # export every 0.2 s instead of 5 s (inherited)
    traced = {"observability": {"tracing": {"otlp_endpoint": jaeger.otlp_endpoint}}}
    kas1, kas2 = system.kas(**traced), system.kas(**traced)
    monkeypatch.setenv(ENDPOINT_ENV, jaeger.otlp_endpoint)  # agentk only: started after this
    server_url, received = api_server
    agent_id = await connect_agent(system, kas_hub, kas2, server_url, tmp_path)
    pat = f"glpat-traced-{agent_id}"
    kas_hub.grant_proxy_access(pat, "robot", agent_id, 75)
    kubectl = Kubectl(cluster_assets()["kubectl"], proxy_kubeconfig(tmp_path / "kc", kas1, f"pat:{agent_id}:{pat}"))

    result = await run(kubectl, "get", "--raw", _POD_PATH)

    assert '"name":"traced"' in result.stdout.replace(" ", "")
    assert len(received) == 1 and received[0], f"the API server got no traceparent: {received}"
    _version, trace_id, parent_span_id, _flags = received[0].split("-")
    trace = await _whole_trace(jaeger, trace_id, services=3)
    processes = trace["processes"]
    spans = {s["spanID"]: s for s in trace["spans"]}

    def parent_of(span: dict[str, Any]) -> dict[str, Any]:
        ref = next(r for r in span["references"] if r["refType"] == "CHILD_OF")
        return spans[ref["spanID"]]

    # API server <- agentk's client span <- agentk's tunnelled call <- gateway kas <- routing kas <- kas' proxy.
    http = spans[parent_span_id]
    assert http["operationName"] == "HTTP GET"
    agentk = parent_of(http)
    assert agentk["operationName"] == "agentk /gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest"
    gateway = parent_of(agentk)
    assert gateway["operationName"] == "kas gateway /gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest"
    route = parent_of(gateway)
    assert route["operationName"] == "kas route /gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest"
    proxy = parent_of(route)
    assert proxy["operationName"] == "k8s_api_proxy GET"
    assert not proxy["references"], "kubectl sent no trace context: the proxy's span is the root"

    # Each hop ran in the process it claims: the routing kas is kas 1, the gateway kas is kas 2.
    assert processes[http["processID"]]["serviceName"] == "tether-agentk"
    assert processes[agentk["processID"]]["serviceName"] == "tether-agentk"
    assert _instance(processes[gateway["processID"]]) == kas2.private_url
    assert _instance(processes[route["processID"]]) == kas1.private_url
    assert _instance(processes[proxy["processID"]]) == kas1.private_url
    assert {"key": "http.response.status_code", "type": "int64", "value": 200} in http["tags"]

    # The hub's kas client (in this process, traced like the hub): GetPods on kas 1's api listener -> kas 2 ->
    # agentk's pods module -> its API server list.
    tracing.setup("tether-hub", jaeger.otlp_endpoint)
    try:
        client = KasApiClient(kas1.api_target, load_base64_secret(kas_hub.secret_file))
        try:
            assert list(await client.get_pods(agent_id)) == []
        finally:
            await client.close()
    finally:
        tracing.shutdown()  # exports this process' span and turns tracing off again
    assert len(received) == 2 and received[1], f"the API server got no traceparent: {received}"
    _version, trace_id, parent_span_id, _flags = received[1].split("-")
    trace = await _whole_trace(jaeger, trace_id, services=4)
    processes = trace["processes"]
    print("TRACE", __import__("json").dumps(trace))
    spans = {s["spanID"]: s for s in trace["spans"]}
    chain = [spans[parent_span_id]]
    while chain[-1]["references"]:
        chain.append(parent_of(chain[-1]))
    method = "/gitlab.agent.pods.rpc.Pods/GetPods"
    assert [s["operationName"] for s in chain] == [
        "HTTP GET",
        f"agentk {method}",
        f"kas gateway {method}",
        f"kas route {method}",
        f"hub {method}",
    ]
    assert [processes[s["processID"]]["serviceName"] for s in chain] == [
        "tether-agentk",
        "tether-agentk",
        "tether-kas",
        "tether-kas",
        "tether-hub",
    ]
