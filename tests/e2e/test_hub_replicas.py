"""Two hubs on one PostgreSQL database behind HAProxy (issue 26 item 2).

Both start at the same moment on an empty database and come up (the database is migrated once). Then REST
clients, a signed-in console (session cookie and CSRF token) and a real kas (agent tokens and configuration
through the internal API) load them while one hub is killed with SIGKILL: no request fails except those the
dead hub had in flight, every write that was answered is in the database, and none is there twice.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.fixtures.hub_replicas import HubAddress, HubReplicas, Load, Outcome, beyond_in_flight, rows
from tests.fixtures.system import System
from tether.hub.db import migrate

pytestmark = [pytest.mark.postgres]

#: Seconds of load, and when in them the first hub is killed.
LOAD_S, KILL_AT_S = 10.0, 3.0


def test_a_hub_killed_under_load_loses_nothing(postgres_url: str, tmp_path: Path, private_secret_file: Path) -> None:
    began = time.monotonic()
    marks: dict[str, float] = {}
    replicas = HubReplicas(tmp_path / "hubs", postgres_url).start()
    marks["hubs"] = time.monotonic() - began
    system = System(tmp_path, HubAddress(replicas.url, replicas.secret_file), private_secret_file, None, None)  # type: ignore[arg-type]
    try:
        # Started together on an empty database: both serve, and the schema was created once.
        [(revision,)] = asyncio.run(rows(postgres_url, "SELECT version_num FROM alembic_version"))
        assert revision == migrate.head_revision()
        created = [replicas.log(i).count("Running upgrade  -> 0001") for i in range(2)]
        assert sorted(created) == [0, 1], f"the first migration ran {created} times"

        admin_token = replicas.bootstrap()
        marks["bootstrap"] = time.monotonic() - began
        kas = system.kas(use_redis=False)
        marks["kas"] = time.monotonic() - began
        load = Load.seeded(replicas, admin_token, kas.agent_address)
        kill_window = asyncio.run(load.run(seconds=LOAD_S, at=KILL_AT_S, action=lambda: replicas.kill_off_loop(0)))
        killed_at = kill_window[1]
        outcomes = load.outcomes

        before = [o for o in outcomes if o.ended < killed_at]
        for kind in ("rest_read", "rest_write", "console_read", "console_write", "internal"):
            assert any(o.kind == kind and o.ok for o in before), f"no {kind} succeeded before the kill"
            assert any(o.kind == kind and o.ok and o.started > killed_at for o in outcomes), f"no {kind} after"
        for index in range(2):  # both hubs served the console: the session and its CSRF token work on either
            assert "POST /tokens 201" in replicas.log(index), f"hub {index + 1} served no console write"
        failed = beyond_in_flight(outcomes, kill_window)
        assert failed == [], f"{len(failed)} requests failed that were not in flight at the kill: {failed[:5]}"
        lost = [o for o in outcomes if not o.ok]
        print(f"{len(outcomes)} requests, {len(lost)} failed, all in flight at the kill; timings {marks}")

        _check_writes(postgres_url, outcomes)
    finally:
        system.stop_all()
        replicas.stop()


def _check_writes(url: str, outcomes: list[Outcome]) -> None:
    """Every answered write is in the database once; a write lost in flight is there at most once."""
    counted = asyncio.run(
        rows(
            url,
            "SELECT name, count(*) FROM cluster_agent_tokens GROUP BY name "
            "UNION ALL SELECT name, count(*) FROM personal_access_tokens GROUP BY name",
        )
    )
    stored = {str(name): int(count) for name, count in counted}
    writes = [o for o in outcomes if o.name]
    assert writes
    for outcome in writes:
        count = stored.get(outcome.name, 0)
        if outcome.ok:
            assert count == 1, f"{outcome.kind} {outcome.name} answered, stored {count} times"
        else:
            assert count <= 1, f"{outcome.kind} {outcome.name} stored {count} times"
