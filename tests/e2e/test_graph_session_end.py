"""Graph API sessions end without leaving a task behind (issue 27 item 8, first finding).

kas logged ``Task was destroyed but it is pending!`` (asyncio, level error) when Graph API WebSocket
sessions ended: a task the session started (the relay's queue getter, the routed call) was dropped while it
still waited, and the collector found it later. Every session shape is run here against the real hub, two kas
(the session on kas 1, agentk on kas 2, so the call goes through the gateway kas) and the cluster; then both
kas' logs must hold no line at level error.

Collection of such a task is not immediate (kas spaces its full collections), so after the shapes the test
runs more sessions that read their initial graph and close, which allocate enough to run the young and middle
generations several times; the leaked tasks of the issue were young and showed up within the shapes
themselves (4 to 16 lines per ten sessions).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tests.graph.harness import include
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.redis]
AGENT_ID, PROJECT_ID = 731, 73
SESSIONS = 10
SUBPROTOCOL = "gitlab-agent-graph-api"


def error_lines(log: Path) -> list[str]:
    """Lines of a kas JSON log at level error or above (kas logs one JSON object per line)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "critical", "exception"):
            found.append(line)
    return found


class GraphClient:
    """Opens Graph API sessions on one kas for one agent, with a user's PAT."""

    def __init__(self, http: aiohttp.ClientSession, kas: KasProc, pat: str) -> None:
        assert kas.k8s_proxy_ca is not None
        self.http = http
        self.url = kas.k8s_proxy_url + "graph"
        self.ssl = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
        self.headers = {"Authorization": f"Bearer pat:{AGENT_ID}:{pat}"}

    async def open(self) -> aiohttp.ClientWebSocketResponse:
        return await self.http.ws_connect(self.url, protocols=[SUBPROTOCOL], headers=self.headers, ssl=self.ssl)


async def first_text(ws: aiohttp.ClientWebSocketResponse) -> str:
    message = await ws.receive(timeout=60)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    return str(message.data)


def drop(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Go away without a close frame: abort the TLS connection under the WebSocket."""
    # aiohttp has no public abort for a client WebSocket.
    connection = ws._response.connection
    assert connection is not None and connection.transport is not None
    connection.transport.abort()


async def closed_with(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """Read until the server's close frame; its code."""
    while True:
        message = await ws.receive(timeout=60)
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
            return ws.close_code
        assert message.type == aiohttp.WSMsgType.TEXT, message


async def test_graph_sessions_end_without_pending_tasks(
    system: System, k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, kas_hub: RealHub
) -> None:
    kubectl.run("-n", k8s_namespace, "create", "configmap", "shown")
    token, pat = "graph-end-agent-token", "graph-end-pat"
    kas_hub.add_agent(token, AGENT_ID, PROJECT_ID)
    kas_hub.grant_proxy_access(pat, "viewer", AGENT_ID, PROJECT_ID)
    kas1, kas2 = system.kas(), system.kas()
    system.agentk(token, kas2)
    request: dict[str, Any] = {
        "queries": [include("resource == 'configmaps'")],
        "namespaces": {"names": [k8s_namespace]},
    }
    text = json.dumps(request)

    async with aiohttp.ClientSession() as http:
        client = GraphClient(http, kas1, pat)
        # Wait for the agent's tunnel: the first session reads the graph once it is up.
        ws = await client.open()
        await ws.send_str(text)
        assert "shown" in await first_text(ws)
        await ws.close()

        for _ in range(SESSIONS):  # read one message and close
            ws = await client.open()
            await ws.send_str(text)
            assert "shown" in await first_text(ws)
            await ws.close()
        for _ in range(SESSIONS):  # malformed request
            ws = await client.open()
            await ws.send_str('{"queries": [{"include": {"resource_selector_expression": "1 +"}}]}')
            assert await closed_with(ws) == 1007
        for _ in range(SESSIONS):  # a second message
            ws = await client.open()
            await ws.send_str(text)
            await first_text(ws)
            await ws.send_str(text)
            assert await closed_with(ws) == 1008
        for _ in range(SESSIONS):  # a second message before the first answer
            ws = await client.open()
            await ws.send_str(text)
            await ws.send_str(text)
            assert await closed_with(ws) == 1008
        for _ in range(SESSIONS):  # the client goes away mid-stream: TCP closed, no close frame
            ws = await client.open()
            await ws.send_str(text)
            await first_text(ws)
            drop(ws)
        for _ in range(SESSIONS):  # the client goes away before the first answer
            ws = await client.open()
            await ws.send_str(text)
            drop(ws)

        # The Kubernetes API proxy's relay (the same router and tunnels) with the same endings: a request read
        # to its end, a watch read once and closed, a watch whose client goes away, a request refused by kas.
        base = kas1.k8s_proxy_url + f"api/v1/namespaces/{k8s_namespace}/configmaps"
        for _ in range(SESSIONS):
            async with http.get(base, headers=client.headers, ssl=client.ssl) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            async with http.get(base + "?watch=1", headers=client.headers, ssl=client.ssl) as resp:
                assert resp.status == 200
                await resp.content.readline()
            resp = await http.get(base + "?watch=1", headers=client.headers, ssl=client.ssl)
            await resp.content.readline()
            assert resp.connection is not None and resp.connection.transport is not None
            resp.connection.transport.abort()
            outside = kas1.k8s_proxy_url.replace("/k8s-proxy/", "/elsewhere")
            async with http.get(outside, headers=client.headers, ssl=client.ssl) as resp:
                assert resp.status == 400

        # More complete sessions: the collector runs while they allocate, so a dropped task would be found.
        for _ in range(SESSIONS):
            ws = await client.open()
            await ws.send_str(text)
            await first_text(ws)
            await ws.close()
    await asyncio.sleep(1.0)  # let the last closes reach kas before reading its logs

    for kas in (kas1, kas2):
        errors = error_lines(kas.directory / "kas.log")
        assert not errors, f"{kas.name} logged {len(errors)} error lines, e.g. {errors[:3]}"
