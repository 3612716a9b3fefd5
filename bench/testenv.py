"""Benchmark the Kubernetes test environment: cold build time, warm start time and cluster RSS.

Usage: ``uv run python bench/testenv.py [--cold] [--starts N]``

* ``--cold`` builds every binary from scratch into a temporary cache with empty Go build and module
  caches (so module downloads from the proxy are included), then deletes it. Without it the previous
  ``k8s_cold_build_seconds`` figure in the results file is kept.
* warm start: ``N`` full cluster starts with the cached binaries (median reported).
* RSS: total resident memory of the cluster's processes 10 s after the last start.

Writes ``bench/results/testenv.json`` as a list of ``{"metric", "value", "unit"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tether_devenv.build import build
from tether_devenv.cluster import LocalCluster

RESULTS = Path(__file__).parent / "results" / "testenv.json"


def cold_build_seconds() -> float:
    """Build all binaries with empty caches in a temporary directory; return wall seconds."""
    with tempfile.TemporaryDirectory(prefix="tether-cold-") as tmp:
        saved = {k: os.environ.get(k) for k in ("TETHER_CACHE_DIR", "GOCACHE", "GOMODCACHE", "GOFLAGS")}
        os.environ.update(
            TETHER_CACHE_DIR=f"{tmp}/cache", GOCACHE=f"{tmp}/gocache", GOMODCACHE=f"{tmp}/gomod", GOFLAGS="-modcacherw"
        )
        try:
            started = time.monotonic()
            build(progress=lambda line: print(f"  {line}", flush=True))
            return time.monotonic() - started
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Run the measurements and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also measure a cold build (several minutes)")
    parser.add_argument("--starts", type=int, default=3, help="number of warm starts")
    args = parser.parse_args()
    previous = {r["metric"]: r for r in json.loads(RESULTS.read_text())} if RESULTS.exists() else {}

    results = []
    if args.cold:
        cold = cold_build_seconds()
        print(f"cold build: {cold:.0f} s")
        results.append({"metric": "k8s_cold_build_seconds", "value": round(cold, 1), "unit": "s"})
    elif "k8s_cold_build_seconds" in previous:
        results.append(previous["k8s_cold_build_seconds"])

    build(progress=lambda _: None)
    starts, rss = [], 0.0
    with tempfile.TemporaryDirectory(prefix="tether-warm-") as tmp:
        for index in range(args.starts):
            cluster = LocalCluster(Path(tmp) / f"c{index}")
            began = time.monotonic()
            info = cluster.start()
            starts.append(time.monotonic() - began)
            if index == args.starts - 1:
                time.sleep(10)
                rss = info.rss_mib()
            cluster.stop()
    warm = statistics.median(starts)
    print(f"warm start: median {warm:.2f} s of {[round(s, 2) for s in starts]}; cluster RSS {rss:.0f} MiB")
    results.append({"metric": "k8s_warm_start_seconds", "value": round(warm, 2), "unit": "s"})
    results.append({"metric": "k8s_cluster_rss_mib", "value": round(rss, 0), "unit": "MiB"})
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    model = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    print(f"machine: {os.cpu_count()} CPUs, {model.split(':')[-1].strip()}, {platform.platform()}")


if __name__ == "__main__":
    main()
