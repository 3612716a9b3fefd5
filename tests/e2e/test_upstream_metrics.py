"""kas exposes the metrics users of upstream know, under upstream's names, beside Tether's (issue 25 item 4).

Names, types and labels as in upstream's source (``../shared/reference/kas.md`` §2.5, §3, §8.5; the list is in
``docs/observability.md``). Two kas share Redis; agentk is connected to kas 2 only, and requests with a personal
access token go through kas 1's Kubernetes API proxy, so kas 1 routes and kas 2 holds the tunnels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_k8s_proxy import https_client
from tests.e2e.test_k8s_proxy_upgrade import connect_agent
from tests.fixtures.hub import RealHub
from tests.fixtures.system import KasProc, System
from tether import __version__

pytestmark = [pytest.mark.redis]

#: metric family name -> type, as upstream declares them.
_FAMILIES = {
    "connected_agents_count": "gauge",
    "agent_server_rate_exceeded": "counter",
    "k8s_api_proxy_routing_duration_seconds": "histogram",
    "k8s_api_proxy_routing_timeout": "counter",
    "gitlab_build_info": "gauge",
    "grpc_server_requests_in_flight": "gauge",
    "k8s_api_proxy_requests_via_pat_access": "unknown",
    "k8s_api_proxy_requests_via_user_access": "unknown",
    "k8s_api_proxy_requests_via_ci_access": "unknown",
    "k8s_api_proxy_requests_unique_users_via_pat_access": "gauge",
    "k8s_api_proxy_requests_unique_agents_via_pat_access": "gauge",
    "k8s_api_proxy_requests_unique_users_via_user_access": "gauge",
    "k8s_api_proxy_requests_unique_agents_via_ci_access": "gauge",
}


@pytest_asyncio.fixture
async def api_server() -> AsyncIterator[str]:
    """An API server stand-in answering every GET with an empty pod list."""

    async def pods(_request: web.Request) -> web.Response:
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": []})

    app = web.Application()
    app.router.add_get("/{tail:.*}", pods)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _samples(kas: KasProc) -> tuple[dict[str, str], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """(family name -> type, (sample name, labels) -> value) of one scrape."""
    types: dict[str, str] = {}
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(kas.metrics()):
        types[family.name] = family.type
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return types, values


def _value(values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return values[(name, frozenset(labels.items()))]


async def test_kas_exposes_upstream_metrics_with_sensible_values(
    system: System, kas_hub: RealHub, api_server: str, tmp_path: Path
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id = await connect_agent(system, kas_hub, kas2, api_server, tmp_path)
    pat = f"glpat-metrics-{agent_id}"
    kas_hub.grant_proxy_access(pat, "robot", agent_id, 75)
    async with https_client(kas1) as client:
        for _ in range(3):
            async with client.get(
                kas1.k8s_proxy_url + "api/v1/pods", headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"}
            ) as response:
                assert response.status == 200, await response.text()

    deadline = time.monotonic() + 30
    while True:  # connected_agents_count is read from Redis by a background loop
        types, values = _samples(kas1)
        if values.get(("connected_agents_count", frozenset()), 0) >= 1:
            break
        assert time.monotonic() < deadline, "connected_agents_count never counted the agent"
        await asyncio.sleep(0.5)

    assert {name: types.get(name) for name in _FAMILIES} == _FAMILIES
    assert _value(values, "gitlab_build_info", version=__version__, built="") == 1
    assert _value(values, "k8s_api_proxy_requests_via_pat_access") == 3
    assert _value(values, "k8s_api_proxy_requests_via_user_access") == 0
    assert _value(values, "k8s_api_proxy_requests_via_ci_access") == 0
    assert _value(values, "k8s_api_proxy_requests_unique_users_via_pat_access") == 1
    assert _value(values, "k8s_api_proxy_requests_unique_agents_via_pat_access") == 1
    assert _value(values, "k8s_api_proxy_requests_unique_users_via_user_access") == 0
    # kas 1 routed the three requests (and found the tunnel each time); nothing timed out or was rate limited.
    assert _value(values, "k8s_api_proxy_routing_duration_seconds_count", status="success") == 3
    assert _value(values, "k8s_api_proxy_routing_duration_seconds_bucket", status="success", le="16.384") == 3
    assert _value(values, "k8s_api_proxy_routing_timeout_total") == 0
    assert _value(values, "agent_server_rate_exceeded_total") == 0
    assert _value(values, "connected_agents_count") == 1

    # kas 2 holds agentk's tunnels and configuration stream: open calls on its agent listener.
    _types2, values2 = _samples(kas2)
    tunnels = _value(
        values2,
        "grpc_server_requests_in_flight",
        grpc_method="Connect",
        grpc_service="gitlab.agent.reverse_tunnel.rpc.ReverseTunnel",
    )
    assert tunnels >= 1
    # Tether's own metrics stay beside them.
    assert ("tunnels_idle", frozenset()) in values2
