"""A revocation committed by a hub replica that stops before any kas acknowledged it is delivered by another
replica (issue 26 item 2). Before, the delivery lived in the committing process only: it was lost with it, and
the token kept working on every kas until kas' cached answer expired. The stopping replica hands it over: another
replica delivers it at once, not after the revocation's 60 s lease.

Real hubs on one PostgreSQL database, a real kas on a private Redis.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.test_revocation_missed import new_agent, revoke
from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System
from tether.hub.service import revocation_outbox
from tether_devenv import pki
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def test_a_revocation_left_by_a_stopped_replica_reaches_kas(
    postgres_url: str,
    tmp_path: Path,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The revocation keeps its default 60 s lease: the stopping replica hands it over, the survivor's next sweep
    # delivers it. (With the lease at 0 instead, the stopping replica's own sweep could claim it for 30 s first.)
    monkeypatch.setattr(revocation_outbox, "SWEEP_INTERVAL_S", 0.5)
    redis = RedisServer(tmp_path / "redis").start()
    launcher = HubLauncher(tmp_path, postgres_url)
    survivor = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", survivor, private_secret_file, None, redis, proxy_tls)
    try:
        kas = system.kas()
        # Replica 1 cannot reach kas while it revokes, then stops: its in-memory delivery dies with it.
        doomed = launcher.launch({"kas.api_address": f"127.0.0.1:{free_port()}", "kas.timeout": "1s"})
        _token, path = new_agent(doomed, "left-behind")
        revoke(doomed, path)
        doomed.stop()
        assert "agent tokens revoked" not in (kas.directory / "kas.log").read_text()

        launcher.start(survivor, {"kas.api_address": kas.api_target})
        deadline = time.monotonic() + 10  # the lease would have held it for 60 s
        while "agent tokens revoked" not in (kas.directory / "kas.log").read_text():
            assert time.monotonic() < deadline, "no replica delivered the revocation to kas"
            time.sleep(0.2)
        deadline = time.monotonic() + 10  # kas logs before it answers: the hub learns of it a moment later
        while "delivered by a sweep" not in survivor.log.text or survivor.db.rows("SELECT id FROM pending_revocations"):
            assert time.monotonic() < deadline, "the hub never saw kas acknowledge, or the revocation stays pending"
            time.sleep(0.2)
    finally:
        system.stop_all()
        launcher.stop_all()
        redis.stop()
