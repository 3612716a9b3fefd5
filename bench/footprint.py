"""Benchmark the idle memory of each process: hub, kas and agentk after start-up with one agent connected.

Usage: ``uv run python bench/footprint.py [--runs N]``

Each run is ``tether up``'s own start-up (``tether_devenv.up.bring_up``): the hub on SQLite, one kas with
its state in memory (the embedded default), one agentk registered through the hub and connected (its
readiness probe says a configuration arrived and a tunnel is up), against one local cluster started once
for all runs. After a 5 s settle, ``VmRSS`` of each process is read from ``/proc``.

kas and agentk run from the runtime package installed without extras into an empty virtual environment
(``tests/support/runtime_venv.py``), as a kas or agentk image carries them; the same figures with the
development environment's ``tether`` (where ``rich`` and ``cryptography`` are installed, and
``structlog`` and ``PyJWT`` load them) are recorded beside them for comparison. The hub always runs from
the development environment (it needs the ``hub`` extra).

The import floor (issue 28 item 4): after reading the RSS, the benchmark asks kas and agentk (through
``tests/support/probe``, put on their ``PYTHONPATH`` here only) which modules they have loaded, and a fresh
interpreter of the same virtual environment imports every one of them that is not Tether's own (``tether.*``,
which includes the generated protobuf code), in the same order, and reads its RSS: ``kas_import_floor_mib`` and
``agentk_import_floor_mib``, what the libraries the process loads cost before any of Tether's code or state.
``tests/e2e/test_minimal_imports.py`` keeps what a minimal configuration loads to what it uses.

Each RSS is also split, from ``/proc/<pid>/status``, into its anonymous part (``RssAnon``: the heap, object
arenas, thread stacks, buffers: the process' data) and the rest (``RssFile``: pages of the interpreter and of the
libraries' shared objects that have been touched, their code). ``kas_idle_anon_mib`` beside
``kas_import_floor_anon_mib`` (and agentk's) says how much of the distance to the floor is data the process
holds and how much is library code that running (serving gRPC, the event loop, validating) touches and importing
alone does not.

Writes ``bench/results/footprint.json``: ``agentk_idle_rss_mib`` (target <= 64), ``kas_idle_rss_mib``
(target <= 80), ``hub_idle_rss_mib``, each the median of ``N`` runs, the two import floors (median), the
anonymous parts of the four (median), plus the ``*_dev_venv`` figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.loaded_modules import loaded_modules, probe_environment
from tests.support.runtime_venv import build_runtime_venv
from tether_devenv.cluster import LocalCluster
from tether_devenv.up import TETHER, Running, UpOptions, bring_up

RESULTS = Path(__file__).parent / "results" / "footprint.json"
SETTLE_S = 5.0
#: Imports every module named on stdin, in order, then prints its RSS in KiB and how many failed to import.
FLOOR_SCRIPT = """
import importlib, sys
failed = 0
for name in sys.stdin.read().split():
    try:
        importlib.import_module(name)
    except Exception:
        failed += 1
status = dict(line.split()[:2] for line in open("/proc/self/status") if line.startswith(("VmRSS:", "RssAnon:")))
print(status["VmRSS:"], status["RssAnon:"], failed)
"""


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of ``pid`` in MiB (``VmRSS``; ``RssAnon`` for its anonymous part)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def import_floor_mib(python: str, modules: list[str]) -> tuple[float, float]:
    """RSS and its anonymous part, in MiB, of a fresh ``python`` that imported ``modules`` except Tether's own."""
    libraries = [name for name in modules if name.split(".")[0] not in ("tether", "__main__", "sitecustomize")]
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "TETHER_MODULE_PROBE")}
    done = subprocess.run(
        [python, "-c", FLOOR_SCRIPT], input="\n".join(libraries), capture_output=True, text=True, check=True, env=env
    )
    rss_kib, anon_kib, failed = done.stdout.split()
    print(f"  import floor: {len(libraries)} modules, {failed} not importable alone", flush=True)
    return int(rss_kib) / 1024, int(anon_kib) / 1024


def one_run(work: Path, kubeconfig: Path, runtime_tether: str) -> dict[str, float]:
    """Bring the system up once; return ``{process name: RSS MiB}`` after the settle time.

    kas and agentk also get ``<name>_idle_anon``, ``<name>_import_floor`` and ``<name>_import_floor_anon`` (see
    the module docstring).
    """
    running = Running()
    options = UpOptions(state_dir=work, kubeconfig=kubeconfig, runtime_tether=runtime_tether)
    probe = work.with_name(f"{work.name}-probe")
    probe.mkdir(parents=True)
    path = os.environ.get("PYTHONPATH")
    os.environ.update(probe_environment(probe))
    try:
        asyncio.run(bring_up(options, lambda line: print(f"  {line}", flush=True), running))
        time.sleep(SETTLE_S)
        figures = {process.name: rss_mib(process.pid) for process in running.processes}
        python = str(Path(runtime_tether).parent / "python")
        for process in running.processes:
            if process.name in ("kas", "agentk"):
                figures[f"{process.name}_idle_anon"] = rss_mib(process.pid, "RssAnon")
                floor, floor_anon = import_floor_mib(python, loaded_modules(process.pid, probe))
                figures[f"{process.name}_import_floor"] = floor
                figures[f"{process.name}_import_floor_anon"] = floor_anon
        return figures
    finally:
        running.stop()
        os.environ.pop("TETHER_MODULE_PROBE")
        if path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tether-footprint-") as tmp:
        root = Path(tmp)
        print("installing the runtime package into an empty venv", flush=True)
        runtime = str(build_runtime_venv(root / "runtime") / "bin" / "tether")
        cluster = LocalCluster(root / "cluster")
        kubeconfig = cluster.start().kubeconfig
        samples: dict[str, list[float]] = {}
        try:
            for run in range(args.runs):
                for label, tether in (("", runtime), ("_dev_venv", TETHER)):
                    print(f"run {run + 1}/{args.runs} ({label or 'runtime venv'})", flush=True)
                    figures = one_run(root / f"up{run}{label}", kubeconfig, tether)
                    print(f"  RSS MiB: { {k: round(v, 1) for k, v in figures.items()} }", flush=True)
                    for name in ("agentk", "kas") if label else ("agentk", "kas", "hub"):
                        samples.setdefault(f"{name}_idle_rss_mib{label}", []).append(figures[name])
                    if not label:
                        for name in ("agentk", "kas"):
                            for part in ("import_floor", "idle_anon", "import_floor_anon"):
                                samples.setdefault(f"{name}_{part}_mib", []).append(figures[f"{name}_{part}"])
        finally:
            cluster.stop()
    results = [
        {"metric": metric, "value": round(statistics.median(values), 1), "unit": "MiB"}
        for metric, values in samples.items()
    ]
    results.append({"metric": "runs", "value": args.runs, "unit": "runs"})
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; load before: {load_before}, after: {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
