"""Redis Sentinel failover under load (issue 26 item 1): figures into ``bench/results/ha.json``.

Runs ``tests/e2e/test_sentinel_failover.py`` (two kas on a master, a replica and three sentinels; 20 clients; the
master emptied and killed with ``kill -9``) ``--runs`` times with ``TETHER_BENCH_DIR`` set, and records the
worst value of each figure over the runs:

- ``sentinel_failover_recovery_seconds``: from the kill until the last failed request ended (target <= 10);
- ``sentinel_failover_failed_requests``: requests that failed in a run;
- ``sentinel_failover_longest_request_seconds``: the longest request of a run (deadline 8 s);
- ``sentinel_failover_new_master_seconds``: from the kill until a sentinel named the new master (Sentinel's
  own part: ``down-after-milliseconds`` 1000, then the election);
- ``sentinel_failover_load_average``: the 1-minute load average before the runs (the machine is shared).

Other entries of ``ha.json`` (other benchmarks write there too) are kept.

Usage: ``python bench/sentinel_failover.py [--runs N]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "ha.json"
TEST = "tests/e2e/test_sentinel_failover.py"


def one_run(directory: Path) -> dict[str, float]:
    env = dict(os.environ, TETHER_BENCH_DIR=str(directory))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", TEST]
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    figures: dict[str, float] = json.loads((directory / "sentinel_failover.json").read_text())
    print(json.dumps(figures))
    return figures


def record(figures: dict[str, tuple[float, str]]) -> None:
    """Replace this benchmark's entries of ``ha.json``, keep everyone else's."""
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    results = [r for r in kept if r["metric"] not in figures]
    results += [{"metric": k, "value": round(v, 2), "unit": u} for k, (v, u) in figures.items()]
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the test; the worst one is recorded")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="tether-bench-sentinel-") as tmp:
            runs.append(one_run(Path(tmp)))
    figures = {
        "sentinel_failover_recovery_seconds": (max(r["recovery_s"] for r in runs), "s"),
        "sentinel_failover_failed_requests": (max(r["failed_requests"] for r in runs), "count"),
        "sentinel_failover_longest_request_seconds": (max(r["longest_request_s"] for r in runs), "s"),
        "sentinel_failover_new_master_seconds": (max(r["sentinel_new_master_s"] for r in runs), "s"),
        "sentinel_failover_load_average": (load, "load"),
    }
    for name, (value, unit) in figures.items():
        print(f"{name:40s} {value:10.2f} {unit}")
    print("all runs:", json.dumps(runs))
    record(figures)


if __name__ == "__main__":
    main()
