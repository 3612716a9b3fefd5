"""Recorded exec sessions share one budget per kas (docs/limits.md, "Authenticated client").

A user allowed to exec into an agent's pods holds several sessions open at once and pushes data through each. Every
session's recording keeps at most ``session_recording_max_bytes``, and all of them together at most
``session_recording_max_total_bytes``: here 768 KiB, against the 2 MiB the sessions carry. The sessions' own bytes
are never touched; the recordings beyond the budget are marked incomplete, and everything held goes back once they
are stored.

Real hub, kas and agentk; the pod's exec endpoint behind agentk is a WebSocket (``v5.channel.k8s.io``) that writes
back on stdout what it reads on stdin.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from tests.e2e.test_k8s_proxy_upgrade import client_tls, connect_agent
from tests.fixtures.exec_endpoint import exec_endpoint
from tests.fixtures.hub import RealHub
from tests.fixtures.system import KasProc, System

pytestmark = [pytest.mark.redis]

SESSIONS = 4
BUDGET = 768 * 1024
#: Bytes each session sends on stdin, in messages of CHUNK; the same comes back on stdout: about 512 KiB recorded
#: per session with the WebSocket framing, so the first session fits and the second is cut halfway.
SENT, CHUNK = 256 * 1024, 32 * 1024
EXEC_PATH = "/api/v1/namespaces/default/pods/shell-{}/exec"


@pytest_asyncio.fixture
async def exec_server() -> AsyncIterator[int]:
    async with exec_endpoint() as port:
        yield port


async def _metric(kas: KasProc, name: str) -> float:
    return await asyncio.to_thread(kas.gauge, name)


async def _session_events(hub: RealHub, agent_id: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 60
    while True:
        listed = hub.api().get("/audit_events", params={"agent_id": agent_id, "verb": "exec", "per_page": 100})
        assert listed.status_code == 200, listed.text
        events = [e for e in listed.json() if e["subresource"] == "exec"]
        if len(events) >= SESSIONS:
            return events
        assert time.monotonic() < deadline, f"audit events of the sessions missing: {events}"
        await asyncio.sleep(0.5)


async def test_sessions_held_open_together_never_make_kas_buffer_more_than_the_budget(
    system: System, kas_hub: RealHub, exec_server: int, tmp_path: Path
) -> None:
    kas = system.kas(agent={"kubernetes_api": {"session_recording_max_total_bytes": BUDGET}})
    agent_id = await connect_agent(system, kas_hub, kas, f"http://127.0.0.1:{exec_server}", tmp_path)
    pat = f"glpat-rec-budget-{agent_id}"
    kas_hub.grant_proxy_access(pat, "rec-budget", agent_id, 75)
    kas_hub.record_sessions(agent_id)
    headers = {"Authorization": f"Bearer pat:{agent_id}:{pat}"}
    payload = (b"echo terminal output 0123456789\r\n" * CHUNK)[:CHUNK]  # text, as a terminal sends
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas))) as client:
        sessions = [
            await client.ws_connect(
                kas.k8s_proxy_url + EXEC_PATH.format(n).lstrip("/"), headers=headers, protocols=("v5.channel.k8s.io",)
            )
            for n in range(SESSIONS)
        ]
        try:
            for ws in sessions:  # one after the other, all held open
                received = 0
                for _ in range(SENT // CHUNK):
                    await ws.send_bytes(b"\x00" + payload)
                    answer = await ws.receive_bytes(timeout=30)
                    assert answer == b"\x01" + payload, "a session's bytes were changed"
                    received += len(answer) - 1
                assert received == SENT
            held = await _metric(kas, "tether_kas_session_recording_bytes")
            cut = await _metric(kas, "tether_kas_session_recordings_cut_total")
        finally:
            for ws in sessions:
                await ws.close()
    print(f"held by the recordings with {SESSIONS} sessions open: {held:.0f} bytes (budget {BUDGET}); cut: {cut:.0f}")
    assert 0 < held <= BUDGET
    assert cut == SESSIONS - 1, "each session beyond the first must have been stopped by the budget, once"
    events = await _session_events(kas_hub, agent_id)
    assert sorted(str(e["recording"]) for e in events) == ["complete"] + ["incomplete"] * (SESSIONS - 1), events
    deadline = time.monotonic() + 30
    while (left := await _metric(kas, "tether_kas_session_recording_bytes")) != 0:
        assert time.monotonic() < deadline, f"{left:.0f} bytes still held after every recording was stored"
        await asyncio.sleep(0.2)
