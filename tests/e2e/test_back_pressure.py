"""Back-pressure on every streaming path of the Kubernetes API proxy (issue 9 item 2).

A client stops reading while the cluster side sends 100 MiB: kas and agentk must not buffer it (RSS growth
stays under 32 MiB), the sender must stall, and the stream must resume and complete once the client reads
again. Paths: same kas (the routing kas holds the tunnel: the in-memory gateway pipe) and cross kas (kas 1 ->
kas 2 -> agentk), each for a plain response and for an HTTP upgrade (raw bytes after ``101``).

agentk's kubeconfig points at a small endpoint started here that streams the 100 MiB (a real API server
cannot be made to send 100 MiB on demand without storing it first).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from pathlib import Path

import pytest

from tests.e2e.test_k8s_proxy_upgrade import client_tls
from tests.fixtures.bulk_endpoint import CHUNK, TOTAL, Bulk, agent_behind, rss_mib
from tests.fixtures.hub import RealHub
from tests.fixtures.system import KasProc, System

pytestmark = [pytest.mark.redis]

#: The target of issue 9: kas and agentk RSS growth while a client does not read.
MAX_GROWTH_MIB = 32.0


async def wait_stalled(bulk: Bulk, quiet_s: float = 3.0, limit_s: float = 90.0) -> None:
    """Wait until the endpoint has sent nothing for ``quiet_s`` seconds (everything on the way is full)."""
    last, since, deadline = bulk.sent, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the sender never stalled: {bulk.sent} bytes sent"
        await asyncio.sleep(0.25)
        if bulk.sent != last:
            last, since = bulk.sent, time.monotonic()


async def open_client(kas: KasProc, tls: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    # A small receive buffer on the client socket, so what stalls is kas, not the kernel.
    return await asyncio.open_connection(
        "127.0.0.1", kas.ports["k8s_proxy"], ssl=tls, server_hostname="127.0.0.1", limit=CHUNK
    )


@pytest.mark.parametrize("route", ["same_kas", "cross_kas"])
@pytest.mark.parametrize("kind", ["response", "upgrade"])
async def test_slow_client_keeps_kas_and_agentk_memory_bounded(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path, route: str, kind: str
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id, pat = await agent_behind(system, kas_hub, bulk, kas2, tmp_path)
    agentk = system.started[-1]
    assert not isinstance(agentk, KasProc) and agentk.process.popen is not None
    pids = {"kas1": kas1.process.pid, "kas2": kas2.process.pid, "agentk": agentk.process.pid}  # type: ignore[union-attr]
    entry = kas2 if route == "same_kas" else kas1
    before = {name: rss_mib(pid) for name, pid in pids.items()}

    reader, writer = await open_client(entry, client_tls(entry))
    try:
        upgrade = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n" if kind == "upgrade" else ""
        writer.write(
            (
                f"GET /k8s-proxy/bulk HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer pat:{agent_id}:{pat}\r\n"
                f"{upgrade}Content-Length: 0\r\n\r\n"
            ).encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 101 " if kind == "upgrade" else b"HTTP/1.1 200 "), head
        received = len(await asyncio.wait_for(reader.readexactly(CHUNK), 30))

        # The client stops reading: the cluster side must stall long before 100 MiB.
        await wait_stalled(bulk)
        during = {name: rss_mib(pid) for name, pid in pids.items()}
        growth = {name: round(during[name] - before[name], 1) for name in pids}
        if bench_dir := os.environ.get("TETHER_BENCH_DIR"):  # bench/hardening.py collects the figures
            figures = {"growth_mib": growth, "sent_while_stalled": bulk.sent}
            (Path(bench_dir) / f"back_pressure_{route}_{kind}.json").write_text(json.dumps(figures))
        assert bulk.sent < TOTAL // 2, f"{bulk.sent} bytes left the endpoint while the client did not read"
        assert all(g < MAX_GROWTH_MIB for g in growth.values()), growth

        # Reading again resumes the stream to its end.
        while received < TOTAL:
            data = await asyncio.wait_for(reader.read(1024 * 1024), 60)
            assert data, f"the stream ended after {received} of {TOTAL} bytes"
            received += len(data)
        assert received == TOTAL
    finally:
        writer.close()
