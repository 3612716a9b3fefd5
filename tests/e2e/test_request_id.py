"""One request followed across processes by its ``request_id``, one agentk connection by its ``connection_id``
(issue 9 item 6).

kas gives each proxied request an id, logs with it, and passes it to agentk (gRPC metadata) and to the hub
(``X-Request-Id``, which the hub's access log records); every process writes JSON lines with the same context
fields. agentk's connection id (its pod id) is on its own lines and on kas' lines about its tunnels,
configuration stream and registrations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.test_k8s_proxy_upgrade import client_tls
from tests.fixtures.bulk_endpoint import Bulk, agent_behind
from tests.fixtures.hub import RealHub
from tests.fixtures.system import KasProc, System
from tests.support.polling import poll_sync

pytestmark = [pytest.mark.redis]


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


async def get_broken(kas: KasProc, agent_id: int, pat: str) -> None:
    """``GET /broken`` through ``kas``' proxy: the cluster side closes without an answer, so every hop logs."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(kas))) as session,
        session.get(kas.k8s_proxy_url + "broken", headers={"Authorization": f"Bearer pat:{agent_id}:{pat}"}) as resp,
    ):
        assert resp.status == 502


async def test_request_id_follows_a_request_from_kas_to_agentk_and_the_hub(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    kas1, kas2 = system.kas(), system.kas()
    agent_id, pat = await agent_behind(system, kas_hub, bulk, kas2, tmp_path)
    agentk = system.started[-1]
    await get_broken(kas1, agent_id, pat)

    kas_log = kas1.directory / "kas.log"
    agentk_log = system.directory / f"{agentk.name}.log"

    def failures() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        on_kas = [e for e in json_lines(kas_log) if "k8s proxy request failed" in str(e.get("event"))]
        on_agentk = [e for e in json_lines(agentk_log) if e.get("event") == "k8s_proxy_request_failed"]
        return on_kas, on_agentk

    poll_sync(lambda: all(failures()), "both processes logging the failed request", limit=10)
    on_kas, on_agentk = failures()
    request_id = on_kas[-1]["request_id"]
    assert request_id and request_id == on_agentk[-1]["request_id"]
    assert on_kas[-1]["agent_id"] == agent_id == on_agentk[-1]["agent_id"]
    assert on_kas[-1]["kas_url"] == kas1.private_url
    assert on_agentk[-1]["kas_url"].endswith(str(kas2.ports["agent"]))
    # kas1 asked the real hub whether the token may use the agent (X-Request-Id): the hub's access log has the id.
    authorizations = [
        line for line in kas_hub.log.text.splitlines() if "/api/v4/internal/kubernetes/authorize_proxy_user " in line
    ]
    assert authorizations, "kas asked the hub about the token"
    assert any(line.endswith(f" request_id={request_id}") for line in authorizations), authorizations


async def test_connection_id_ties_kas_lines_of_tunnels_and_configuration_stream_to_agentk(
    system: System, kas_hub: RealHub, bulk: Bulk, tmp_path: Path
) -> None:
    kas = system.kas(observability={"logging": {"level": "debug"}})
    agent_id, pat = await agent_behind(system, kas_hub, bulk, kas, tmp_path)
    agentk = system.started[-1]
    await get_broken(kas, agent_id, pat)
    kas_log = kas.directory / "kas.log"
    agentk_log = system.directory / f"{agentk.name}.log"

    def lines(path: Path, event: str) -> list[dict[str, Any]]:
        return [e for e in json_lines(path) if e.get("event") == event]

    kas_events = ("tunnel opened", "sent agent configuration", "registered agentk pod")
    poll_sync(
        lambda: lines(agentk_log, "agent_registered") and all(lines(kas_log, e) for e in kas_events),
        "agentk registered and kas logging its tunnel, configuration stream and registration",
        limit=15,
    )
    registered = lines(agentk_log, "agent_registered")[-1]
    connection_id = registered["pod_id"]
    assert isinstance(connection_id, int) and connection_id > 0
    assert registered["connection_id"] == connection_id
    started = lines(agentk_log, "agentk_started")[-1]
    assert started["connection_id"] == connection_id  # on every agentk line, not only the registrar's
    for event in kas_events:
        line = lines(kas_log, event)[-1]
        assert line["connection_id"] == connection_id, (event, line)
        assert line["agent_id"] == agent_id, (event, line)
        assert line["kas_url"] == kas.private_url
