"""Kill one of two hubs under load and count the requests lost (issue 26 item 2).

Usage: ``python bench/hub_replicas.py [--seconds 30] [--kill-at 10] [--workers 4]``

The set-up of ``tests/e2e/test_hub_replicas.py`` (``tests/fixtures/hub_replicas.py``): a private PostgreSQL,
two ``tether hub serve`` processes on one database, started at the same moment, HAProxy (Debian's package)
balancing over them, a real kas whose internal API calls go through HAProxy. ``--workers`` clients of each kind
(REST reads, REST writes, console reads, console writes with the session's CSRF token, kas configuration
streams with agent tokens) run for ``--seconds``; ``--kill-at`` seconds in, the first hub gets SIGKILL.

Figures (``bench/results/ha.json``, this script's entries only; the file is shared with the other issue 26
benchmarks):

* ``hub_replica_kill_failed_requests``: failed requests that were not in flight while the hub was being killed
  (target 0);
* ``hub_replica_kill_in_flight_failed_requests``: failed requests that were (the dead hub never answered them);
* ``hub_replica_kill_requests``: every request of the run;
* ``hub_replica_kill_duplicate_writes``: writes stored more than once (target 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.hub_replicas import HubAddress, HubReplicas, Load, beyond_in_flight, rows
from tests.fixtures.system import System, write_private_secret
from tether_devenv.postgres_server import PostgresServer

RESULTS = ROOT / "bench" / "results" / "ha.json"
MINE = (
    "hub_replica_kill_failed_requests",
    "hub_replica_kill_in_flight_failed_requests",
    "hub_replica_kill_requests",
    "hub_replica_kill_duplicate_writes",
)


def run(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    """Run the scenario once; the figures as ``{metric, value, unit}``."""
    postgres = PostgresServer(directory / "postgres")
    postgres.start()
    replicas: HubReplicas | None = None
    system: System | None = None
    try:
        name = f"bench_{uuid.uuid4().hex[:8]}"
        postgres.create_database(name)
        url = postgres.sqlalchemy_url_for(name)
        replicas = HubReplicas(directory / "hubs", url).start()
        secret = write_private_secret(directory / "private_secret")
        system = System(directory, HubAddress(replicas.url, replicas.secret_file), secret, None, None)  # type: ignore[arg-type]
        admin_token = replicas.bootstrap()
        kas = system.kas(use_redis=False)
        load = Load.seeded(replicas, admin_token, kas.agent_address, workers=args.workers)
        started = replicas
        window = asyncio.run(load.run(seconds=args.seconds, at=args.kill_at, action=lambda: started.kill_off_loop(0)))
        failed = [o for o in load.outcomes if not o.ok]
        beyond = beyond_in_flight(load.outcomes, window)
        stored = asyncio.run(
            rows(
                url,
                "SELECT count(*) FROM (SELECT name FROM cluster_agent_tokens GROUP BY name HAVING count(*) > 1 "
                "UNION ALL SELECT name FROM personal_access_tokens GROUP BY name HAVING count(*) > 1) AS twice",
            )
        )
        for outcome in beyond:
            print(f"failed beyond the kill: {outcome}", file=sys.stderr)
        return [
            {"metric": MINE[0], "value": len(beyond), "unit": "count"},
            {"metric": MINE[1], "value": len(failed) - len(beyond), "unit": "count"},
            {"metric": MINE[2], "value": len(load.outcomes), "unit": "count"},
            {"metric": MINE[3], "value": int(stored[0][0]), "unit": "count"},  # type: ignore[call-overload]
        ]
    finally:
        if system is not None:
            system.stop_all()
        if replicas is not None:
            replicas.stop()
        postgres.stop()


def record(figures: list[dict[str, Any]]) -> None:
    """Replace this script's entries in the shared results file, keeping everyone else's."""
    kept = (
        [entry for entry in json.loads(RESULTS.read_text()) if entry["metric"] not in MINE] if RESULTS.exists() else []
    )
    RESULTS.write_text(json.dumps(kept + figures, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--kill-at", type=float, default=10.0, help="seconds into the load when hub 1 is killed")
    parser.add_argument("--workers", type=int, default=4, help="clients of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hub-replicas-") as tmp:
        figures = run(args, Path(tmp))
    print(json.dumps(figures, indent=2))
    print(f"load average: {os.getloadavg()}")
    record(figures)


if __name__ == "__main__":
    main()
