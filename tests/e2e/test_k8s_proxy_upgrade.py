"""HTTP upgrades through kas 1 -> kas 2 -> agentk -> an upgrade endpoint, raw bytes both ways (kas.md §5.3-5.4).

kwok runs no kubelet, so ``kubectl exec`` reaches the API server's upgrade but no container; it is checked
to end exactly as it does directly. For the bytes themselves, each agentk's kubeconfig points at a small
server started here: a WebSocket echo (aiohttp) and a SPDY-like endpoint that answers ``101`` and then
speaks raw bytes. Agents are connected to kas 2 only; the client talks to kas 1 over TLS.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import yaml
from aiohttp import web

from tests.e2e.test_k8s_proxy import start_proxied
from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.redis]

_ids = itertools.count(7501)


def agent_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig that sends agentk to ``server`` with ``token`` as its own credentials."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "agent", "user": {"token": token}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@dataclass
class Endpoints:
    """The upgrade endpoints behind the agents, and what reached them."""

    ws_port: int = 0
    raw_port: int = 0
    ws_headers: list[list[tuple[str, str]]] = field(default_factory=list)
    raw_heads: list[bytes] = field(default_factory=list)


ENDPOINTS = web.AppKey("endpoints", Endpoints)


async def websocket_echo(request: web.Request) -> web.WebSocketResponse:
    endpoints = request.app[ENDPOINTS]
    endpoints.ws_headers.append(list(request.headers.items()))
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    await ws.send_str("welcome")  # the server speaks first: bytes flow agent -> client unprompted
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT:
            await ws.send_str(message.data.upper())
        elif message.type == aiohttp.WSMsgType.BINARY:
            await ws.send_bytes(message.data[::-1])
    return ws


def raw_endpoint(endpoints: Endpoints) -> Any:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        endpoints.raw_heads.append(head)
        if b"upgrade: spdy/3.1" not in head.lower():
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
        buffer = b""
        while data := await reader.read(65536):
            buffer += data
            if buffer.endswith(b"\nEND\n"):
                break
            writer.write(data.upper())
            await writer.drain()
        writer.write(b"BYE")  # then the server closes: the client must see the end of the stream
        await writer.drain()
        writer.close()

    return serve


@pytest_asyncio.fixture
async def endpoints() -> AsyncIterator[Endpoints]:
    found = Endpoints()
    app = web.Application()
    app[ENDPOINTS] = found
    app.router.add_get("/ws", websocket_echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.ws_port = runner.addresses[0][1]
    raw = await asyncio.start_server(raw_endpoint(found), "127.0.0.1", 0)
    found.raw_port = raw.sockets[0].getsockname()[1]
    try:
        yield found
    finally:
        raw.close()
        await runner.cleanup()


async def connect_agent(
    system: System,
    kas_hub: RealHub,
    kas: KasProc,
    server: str,
    tmp_path: Path,
    redis_client: Callable[[], aioredis.Redis] | None = None,
) -> int:
    """Start agentk on ``kas`` with ``server`` as its cluster; return its agent id once the tunnel tracker lists
    ``kas`` for it (read with ``redis_client()`` when the system's own Redis is not kas' one)."""
    agent_id = next(_ids)
    token = f"upgrade-agent-{agent_id}-{time.monotonic_ns()}"
    kas_hub.add_agent(token, agent_id, 75, f"upgrade-{agent_id}")
    kubeconfig = agent_kubeconfig(tmp_path / f"agent-{agent_id}.kubeconfig", server, f"sa-token-{agent_id}")
    system.agentk(token, kas, f"upgrade-{agent_id}", kubeconfig=kubeconfig)
    deadline = time.monotonic() + 30
    while kas.private_url not in await system.tunnel_urls(agent_id, redis_client() if redis_client else None):
        assert time.monotonic() < deadline, "agentk did not connect to kas 2"
        await asyncio.sleep(0.1)
    return agent_id


def client_tls(kas: KasProc) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))


async def test_websocket_through_two_kas(
    system: System, kas_hub: RealHub, endpoints: Endpoints, tmp_path: Path
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id = await connect_agent(system, kas_hub, kas2, f"http://127.0.0.1:{endpoints.ws_port}", tmp_path)
    pat = f"glpat-ws-{agent_id}"
    kas_hub.grant_proxy_access(pat, "robot", agent_id, 75)
    headers = {"Authorization": f"Bearer pat:{agent_id}:{pat}"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas1))) as client,
        client.ws_connect(kas1.k8s_proxy_url + "ws", headers=headers) as ws,
    ):
        assert await ws.receive_str() == "welcome"
        for i in range(50):
            await ws.send_str(f"message {i}")
            assert await ws.receive_str() == f"MESSAGE {i}"
        big = bytes(range(256)) * 4096  # 1 MiB: many 32 KiB upgradeData frames each way
        await ws.send_bytes(big)
        assert await ws.receive_bytes() == big[::-1]
    seen = dict(endpoints.ws_headers[-1])
    assert seen["Authorization"] == f"Bearer sa-token-{agent_id}"  # the agent's credentials, not the user's
    assert seen["Upgrade"].lower() == "websocket"
    via = ", ".join(v for k, v in endpoints.ws_headers[-1] if k == "Via")
    assert "gitlab-kas" in via and "gitlab-agent" in via


async def test_non_websocket_upgrade_through_two_kas(
    system: System, kas_hub: RealHub, endpoints: Endpoints, tmp_path: Path
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id = await connect_agent(system, kas_hub, kas2, f"http://127.0.0.1:{endpoints.raw_port}", tmp_path)
    pat = f"glpat-spdy-{agent_id}"
    kas_hub.grant_proxy_access(pat, "robot", agent_id, 75)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", kas1.ports["k8s_proxy"], ssl=client_tls(kas1), server_hostname="127.0.0.1"
    )
    try:
        writer.write(
            (
                "POST /k8s-proxy/api/v1/namespaces/x/pods/y/exec?command=sh HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\n"
                f"Authorization: Bearer pat:{agent_id}:{pat}\r\n"
                "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
                "Content-Length: 0\r\n\r\n"
            ).encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 101 ")
        assert b"upgrade: spdy/3.1" in head.lower()
        for i in range(20):
            payload = f"frame {i} ".encode() * 5000  # 40-50 KB each: more than one upgradeData frame
            writer.write(payload)
            assert await asyncio.wait_for(reader.readexactly(len(payload)), 30) == payload.upper()
        writer.write(b"\nEND\n")
        assert await asyncio.wait_for(reader.read(), 30) == b"BYE"  # the endpoint closed: so did kas
    finally:
        writer.close()
    sent = endpoints.raw_heads[-1].decode()
    assert sent.startswith("POST /api/v1/namespaces/x/pods/y/exec?command=sh HTTP/1.1\r\n")
    assert f"Authorization: Bearer sa-token-{agent_id}" in sent
    assert "X-Stream-Protocol-Version: v4.channel.k8s.io" in sent


async def kubectl_exec(kc: Kubectl, *args: str, websockets: bool) -> tuple[int, str]:
    """``kubectl exec`` over WebSocket (v5, kubectl's default) or SPDY/3.1; returns (exit code, stderr)."""
    env = dict(os.environ, KUBECTL_REMOTE_COMMAND_WEBSOCKETS="true" if websockets else "false")
    process = await asyncio.create_subprocess_exec(
        str(kc.binary),
        f"--kubeconfig={kc.kubeconfig}",
        f"--cache-dir={kc.kubeconfig.parent / 'kube-cache'}",
        "exec",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, stderr.decode()


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


async def test_kubectl_exec_upgrades_to_the_real_api_server(
    system: System, k8s_cluster: ClusterInfo, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    # kwok has no kubelet, so the command itself cannot run; what matters is that kubectl's upgrade reaches
    # the API server through kas 1 -> kas 2 -> agentk (over TLS) and ends exactly as it does directly.
    proxied = await start_proxied(system, kas_hub, kubectl, tmp_path)
    pat = f"glpat-exec-{proxied.agent_id}"
    kas_hub.grant_proxy_access(pat, "robot", proxied.agent_id, proxied.project_id)
    kc = proxied.kubectl(proxied.pat(pat), "robot", k8s_namespace)
    await asyncio.to_thread(
        kubectl.run, "run", "exec-me", "-n", k8s_namespace, "--image=registry.invalid/x:1", "--restart=Never"
    )
    for websockets in (True, False):
        code, through_kas = await kubectl_exec(kc, "exec-me", "-v=7", "--", "true", websockets=websockets)
        direct_code, direct = await kubectl_exec(
            kubectl, "-n", k8s_namespace, "exec-me", "--", "true", websockets=websockets
        )
        assert (code, last_line(through_kas)) == (direct_code, last_line(direct)), (websockets, through_kas[-2000:])
        if websockets:
            # The API server switched protocols for the client, through the tunnel.
            assert 'status="101 Switching Protocols"' in through_kas
            assert "The subprotocol is v5.channel.k8s.io" in through_kas
