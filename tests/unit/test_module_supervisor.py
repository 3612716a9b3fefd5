"""The supervisor's one restart policy (issue 24 item 3): a module loop that dies is logged, restarted, counted."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tether.modshared.supervisor import ModuleSupervisor


async def test_a_dead_module_loop_is_restarted_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    metrics = CollectorRegistry()
    supervisor = ModuleSupervisor("agentk", metrics, restart_delays=(0.01, 0.01))
    runs: list[int] = []
    third = asyncio.Event()

    async def dies_twice() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("boom")
        if len(runs) == 2:
            return  # a loop that returns is restarted too
        third.set()
        await asyncio.Event().wait()

    supervisor.spawn("example", dies_twice)
    try:
        await asyncio.wait_for(third.wait(), 10)
    finally:
        await supervisor.cancel_loops()
    assert len(runs) == 3
    exposed = generate_latest(metrics).decode()
    assert 'tether_agentk_background_loop_restarts_total{loop="example"} 2.0' in exposed
    messages = [r.getMessage() for r in caplog.records]
    assert any("background loop example crashed" in m for m in messages)
    assert any("background loop example returned" in m for m in messages)


async def test_cancel_loops_ends_every_loop() -> None:
    supervisor = ModuleSupervisor("kas")
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = supervisor.spawn("forever", forever)
    await asyncio.wait_for(started.wait(), 10)
    await supervisor.cancel_loops()
    assert task.cancelled()
