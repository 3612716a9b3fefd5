"""kas rolling update under load (issue 26 item 3): ``rolling_restart_failed_requests`` into bench/results/ha.json.

Usage: ``python bench/rolling_restart.py [--runs N]``

Runs ``tests/e2e/test_rolling_restart.py`` (three kas on one Redis behind HAProxy, three agentk processes, 18
clients sending small GETs and 2 watching through the load balancer while each kas in turn gets SIGTERM and is
started again) through pytest with ``TETHER_BENCH_DIR`` set, ``--runs`` times, and records the failed requests
summed over the runs, the requests made, and the longest GET, with the load average (``/proc/loadavg``) before
and after. Only this benchmark's metrics in ``ha.json`` are replaced; the others (Sentinel, several hubs) are kept.
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
TEST = "tests/e2e/test_rolling_restart.py::test_rolling_restart_of_three_kas_fails_no_request"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def one_run(directory: Path) -> dict[str, object]:
    """Run the test once; return the figures it wrote (the test fails, and so does this, on a failed request)."""
    env = dict(os.environ, TETHER_BENCH_DIR=str(directory))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", TEST]
    subprocess.run(command, cwd=ROOT, env=env, check=False)
    figures: dict[str, object] = json.loads((directory / "rolling_restart.json").read_text())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rolling updates to run (each restarts all three kas)")
    args = parser.parse_args()
    load_before = load_average()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="tether-bench-rolling-") as tmp:
            runs.append(one_run(Path(tmp)))
            print(json.dumps(runs[-1], indent=2))
    load = f"{load_before} before, {load_average()} after"
    figures = {
        "rolling_restart_failed_requests": (sum(int(str(r["rolling_restart_failed_requests"])) for r in runs), "count"),
        "rolling_restart_requests": (sum(int(str(r["requests"])) for r in runs), "count"),
        "rolling_restart_longest_get_s": (max(float(str(r["longest_get_s"])) for r in runs), "s"),
        "rolling_restart_agent_tunnel_failures": (sum(int(str(r["agent_tunnel_failures"])) for r in runs), "count"),
    }
    for name, (value, unit) in figures.items():
        print(f"{name:40s} {value:10} {unit}")
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    results = [r for r in kept if r["metric"] not in figures]
    results += [{"metric": k, "value": v, "unit": u, "runs": args.runs, "load": load} for k, (v, u) in figures.items()]
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
