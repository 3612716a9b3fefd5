"""The internal API kas calls keeps answering while user traffic holds every connection of the users' pool.

Issue 27 item 3: three costly GraphQL queries exhausted the hub's one pool, and kas' ``authorize_proxy_user`` (so
kubectl through kas) and ``agent_info`` failed with 500 after the pool's timeout. Here real GraphQL requests wait
on a table lock the test holds on PostgreSQL, one connection of the users' pool each, more of them than the pool
has; meanwhile kas' calls must be answered. On SQLite every writer queues on the file's lock whatever the pool,
and kas' per-connection reads (``agent_info``, ``agent_configuration``) already have their own reader thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import NullPool, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fixtures.hub import RealHub
from tests.hub.helpers import kas_config, project_with_agent
from tests.hub.test_graphql_cost import hub_database
from tests.hub.workspace_helpers import graphql

pytestmark = pytest.mark.postgres


class TableLock:
    """``LOCK TABLE <table> IN ACCESS EXCLUSIVE MODE`` held by a connection of its own until :meth:`release`."""

    def __init__(self, url: str, table: str) -> None:
        self._url, self._table = url, table
        self._locked, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)
        self._thread.start()
        assert self._locked.wait(30), "the lock was not taken"

    async def _hold(self) -> None:
        engine = create_async_engine(self._url, poolclass=NullPool)
        try:
            async with engine.begin() as connection:
                await connection.execute(text(f"LOCK TABLE {self._table} IN ACCESS EXCLUSIVE MODE"))
                self._locked.set()
                await asyncio.to_thread(self._release.wait)
        finally:
            await engine.dispose()

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)


def waiting_on_locks(hub: RealHub) -> int:
    rows = hub.db.rows(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return int(rows[0]["n"])


@pytest.mark.parametrize("hub_backend", ["postgres"], indirect=True)
def test_kas_is_answered_while_users_hold_their_whole_pool(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("developer",))
    kas_config(hub, setup, "user_access:\n  access_as:\n    agent: {}\n")
    agent_token = hub.api().post(
        f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens", json={"name": "agentk"}
    )
    assert agent_token.status_code == 201, agent_token.text
    proxy_token = hub.token_for(setup.user_ids["developer"], ("k8s_proxy",))
    developer = setup.tokens["developer"]
    pool = hub_database(hub).engine.pool
    capacity = pool.size() + pool._max_overflow  # type: ignore[attr-defined]

    lock = TableLock(hub.db.url, "workspaces")
    executor = ThreadPoolExecutor(capacity + 2)
    try:
        users: list[Future[httpx.Response]] = [
            executor.submit(graphql, hub, developer, "query { workspaces { count } }") for _ in range(capacity + 2)
        ]
        deadline = time.monotonic() + 60
        while waiting_on_locks(hub) < capacity:  # every connection of the users' pool is taken
            assert time.monotonic() < deadline, f"{waiting_on_locks(hub)} of {capacity} connections wait on the lock"
            time.sleep(0.1)

        with httpx.Client(base_url=hub.api_url + "/internal/kubernetes", headers=hub.kas_headers(), timeout=90) as kas:
            info = kas.get("agent_info", headers={"Gitlab-Agent-Api-Request": agent_token.json()["token"]})
            assert info.status_code == 200, info.text
            body = {"agent_id": setup.agent_id, "access_type": "personal_access_token", "access_key": proxy_token}
            authorized = kas.post("authorize_proxy_user", json=body)
            assert authorized.status_code == 200, authorized.text
        assert not any(user.done() for user in users), "the users' requests ended before kas was answered"
    finally:
        lock.release()
        executor.shutdown(wait=True)
    for user in users:
        answer = user.result()
        assert answer.status_code == 200 and answer.json()["data"]["workspaces"]["count"] == 0, answer.text
