"""A user's change to a workspace, committed while a reconcile of its agent runs (on another hub replica, or on
the same one), is not overwritten by the state the reconcile computed from the row it read before (issue 26
item 2). Real hub on PostgreSQL, whose row locks the reconcile now takes; SQLite has one writer at a time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fixtures.hub import HubLauncher, RealHub
from tests.hub.workspace_helpers import create, deployment, info, reconcile, workspace_setup

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def pg_hub(postgres_url: str, tmp_path: Path) -> Iterator[RealHub]:
    launcher = HubLauncher(tmp_path, postgres_url)
    try:
        yield launcher.launch()
    finally:
        launcher.stop_all()


async def _stop_while_reconciling(
    hub: RealHub, name: str, run_reconcile: Callable[[], httpx.Response]
) -> httpx.Response:
    """Hold a user's uncommitted "desired Stopped", start the reconcile, commit once it waits on the row."""
    engine = create_async_engine(hub.config.database_url)
    try:
        async with engine.connect() as user, engine.connect() as watcher:
            await user.execute(
                text(
                    "UPDATE workspaces SET desired_state = 'Stopped', desired_state_updated_at = now() WHERE name = :n"
                ),
                {"n": name},
            )
            with ThreadPoolExecutor(1) as pool:
                answer = asyncio.get_running_loop().run_in_executor(pool, run_reconcile)
                deadline = time.monotonic() + 30
                waiting = (
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                while (await watcher.execute(text(waiting))).scalar_one() == 0:
                    assert time.monotonic() < deadline, "the reconcile never reached the workspace's row"
                    assert not answer.done(), "the reconcile finished without meeting the user's row lock"
                    await asyncio.sleep(0.05)
                await user.commit()
                return await answer
    finally:
        await engine.dispose()


def test_a_stop_committed_during_a_reconcile_stays(pg_hub: RealHub) -> None:
    hub = pg_hub
    ws = workspace_setup(hub)
    created = create(hub, ws)
    name, namespace = created["name"], created["namespace"]
    assert reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}).status_code == 201
    running = deployment(name, namespace, "11", 1, 1, "NewReplicaSetAvailable")
    body = {
        "update_type": "partial",
        "workspace_agent_infos": [info(name, namespace, latest_k8s_deployment_info=running)],
    }

    response = asyncio.run(_stop_while_reconciling(hub, name, lambda: reconcile(hub, ws, body)))

    assert response.status_code == 201, response.text
    [row] = hub.db.rows("SELECT desired_state, actual_state FROM workspaces WHERE name = :n", n=name)
    assert row == {"desired_state": "Stopped", "actual_state": "Running"}, "the user's stop was overwritten"
    [answer] = response.json()["workspace_rails_infos"]
    assert answer["desired_state"] == "Stopped", "agentk is told what the user asked"
