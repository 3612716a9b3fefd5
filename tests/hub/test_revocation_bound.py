"""A hub delivers at most ``MAX_DELIVERIES`` revocations in the background at once; the others go to the sweeps.

Before, every revocation started a task that retried for up to 15 minutes: a maintainer revoking tokens in a
loop while kas was away grew the hub's tasks without bound. Now the ones past the bound are handed to the
hubs' sweeps at once (still in the outbox, so none is lost). A real hub whose kas api address answers nothing.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_revocation_missed import new_agent, revoke
from tests.fixtures.hub import HubLauncher
from tether.hub import kas_client
from tether.hub.service import revocation_outbox
from tether_devenv.process import free_port

BOUND = 2
REVOKED = 5


def test_revocations_past_the_bound_are_left_to_the_sweeps(
    hub_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kas_client, "MAX_DELIVERIES", BOUND)
    monkeypatch.setattr(revocation_outbox, "SWEEP_INTERVAL_S", 3600.0)  # no sweep claims a row during the test
    launcher = HubLauncher(tmp_path, hub_database_url)
    hub = launcher.launch({"kas.api_address": f"127.0.0.1:{free_port()}", "kas.timeout": "1s"})
    try:
        for index in range(REVOKED):
            _token, path = new_agent(hub, f"bounded-{index}")
            revoke(hub, path)
        deadline = time.monotonic() + 30
        while len(handed_over(hub.db.rows("SELECT created_at, next_attempt_at FROM pending_revocations"))) < 3:
            assert time.monotonic() < deadline, "the revocations past the bound were not handed to the sweeps"
            time.sleep(0.2)
        assert len(hub.db.rows("SELECT id FROM pending_revocations")) == REVOKED  # none lost
        assert hub.log.text.count("is left to the sweeps") == REVOKED - BOUND
        assert kas_client.DELIVERIES._value.get() == BOUND  # the others still retry in the background
    finally:
        launcher.stop_all()
    assert kas_client.DELIVERIES._value.get() == 0  # given up when the hub stopped, left to the sweeps


def handed_over(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The revocations whose next attempt is due at once, not after the committing hub's lease (60 s)."""
    return [row for row in rows if seconds(row["next_attempt_at"]) - seconds(row["created_at"]) < 30]


def seconds(value: datetime | str) -> float:
    """A timestamp column as seconds (SQLite gives text, PostgreSQL a datetime)."""
    return (datetime.fromisoformat(value) if isinstance(value, str) else value).timestamp()
