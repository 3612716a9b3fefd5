"""What hub replicas on one database share must stay right whichever replica writes last (issue 26 item 2)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tests.e2e.test_throttling import within_one_window
from tests.fixtures.hub import HubLauncher, RealHub
from tests.hub.helpers import post_sign_in
from tether.hub.db.engine import Database
from tether.hub.service.token_use import TokenUseWriter

LIMIT = 4


async def _two_replicas_write_uses(url: str, token_id: int, newer: datetime, older: datetime) -> None:
    replica_a, replica_b = Database(url), Database(url)
    try:
        writer_a, writer_b = TokenUseWriter(replica_a), TokenUseWriter(replica_b)
        writer_a.note(token_id, newer)
        await writer_a.close()
        writer_b.note(token_id, older)  # noted earlier on replica B, whose batch is written later
        await writer_b.close()
    finally:
        await replica_a.close()
        await replica_b.close()


def test_a_replica_writing_an_older_token_use_later_keeps_the_newest(hub: RealHub) -> None:
    hub.add_agent("replica-token-use", 7101, 71)
    [row] = hub.db.rows("SELECT id FROM cluster_agent_tokens WHERE agent_id = 7101")
    newer = datetime(2026, 11, 26, 12, 0, 5, tzinfo=UTC)
    asyncio.run(_two_replicas_write_uses(hub.config.database_url, row["id"], newer, newer - timedelta(seconds=4)))
    [written] = hub.db.rows("SELECT last_used_at FROM cluster_agent_tokens WHERE id = :id", id=row["id"])
    value = written["last_used_at"]
    value = datetime.fromisoformat(value) if isinstance(value, str) else value
    assert value.replace(tzinfo=value.tzinfo or UTC) == newer


def test_replicas_share_the_failed_authentication_count(hub_launcher: HubLauncher) -> None:
    """Two hubs on one database: failures on either count against one limit, so the address is refused on both
    after ``LIMIT`` failures in all (counted per process, it took ``LIMIT`` on each)."""
    overrides = {"security.failed_auth_per_source_per_minute": LIMIT}
    first, second = hub_launcher.launch(overrides), hub_launcher.launch(overrides)
    _, token = first.user("carol")
    within_one_window()
    statuses = [(first, second)[i % 2].api(f"glpat-unknown-{i}").get("/user").status_code for i in range(LIMIT)]
    assert statuses == [401] * LIMIT, statuses
    assert first.api(token).get("/user").status_code == 429
    assert second.api(token).get("/user").status_code == 429
    refused = post_sign_in(second, "carol", token)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
