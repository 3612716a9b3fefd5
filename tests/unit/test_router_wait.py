"""A routed request waiting for an absent agent sleeps until something can change (issue 28, wake-up regression).

In-process: this kas' real gateway and tunnel registry (no tunnels), a tracker that lists no kas, no network.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tether.tunnel.server.gateway import Gateway
from tether.tunnel.server.kas_pool import KasPool
from tether.tunnel.server.notifier import TunnelNotifier
from tether.tunnel.server.registry import TunnelRegistry
from tether.tunnel.server.router import NOT_FOUND_MESSAGE, Router, RoutingError, RoutingOptions

OWN_URL = "grpc://127.0.0.1:1"


class EmptyTracker:
    """The tunnel tracker when the agent is connected nowhere; counts its reads."""

    def __init__(self) -> None:
        self.reads = 0

    async def kas_urls(self, agent_id: int) -> list[str]:
        self.reads += 1
        return []


async def test_waiting_request_does_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = EmptyTracker()
    pool = KasPool(b"s" * 32, None, 1 << 20)
    options = RoutingOptions(find_timeout_s=0.5, try_new_kas_interval_s=0.01, recheck_interval_s=0.2)
    router = Router(OWN_URL, Gateway(TunnelRegistry(None)), pool, tracker, TunnelNotifier(), options)
    turns = 0
    wait_any = Router._wait_any

    async def counted(*args: Any) -> None:
        nonlocal turns
        turns += 1
        await wait_any(*args)

    monkeypatch.setattr(router, "_wait_any", counted)
    try:
        with pytest.raises(RoutingError) as raised:
            await router.route(7, "/gitlab.agent.pods.rpc.Pods/GetPods", None, None, None)  # type: ignore[arg-type]
    finally:
        await pool.close()
    assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED and raised.value.message == NOT_FOUND_MESSAGE
    # This kas' NoTunnel starts the first tracker read; then only the 0.2 s re-reads and the deadline wake the loop.
    # With the loop spinning on the NoTunnel it had already acted on, this was thousands of turns.
    assert 1 <= tracker.reads <= 4
    assert turns <= 12, turns
