"""Figures for bench/results/deploy.json: image sizes, and the Helm install on a real node (issue 22).

Usage:
    python bench/deploy.py [--force] [NAME...]
        image sizes (`make images`; --force rebuilds every image; NAME...: only these images)
    python bench/deploy.py --helm [--runs N]
        starts its own cluster with one real node and installs Tether with its charts exactly as
        tests/node/test_helm_e2e.py does (tests/support/helm_deploy.py), then measures:
        helm_install_to_agent_ready_seconds  `helm install tether-agent` -> both agentk pods Ready
                                            (images already built and imported: a warm machine)
        leader_failover_seconds             leader pod deleted -> another pod holds the Lease (median of N)
        rolling_upgrade_failed_requests     requests of 20 clients through kas that got no answer within
                                            their 30 s deadline during `helm upgrade` of both releases
        real_pod_exec_added_ms              p50 of `kubectl exec <pod> -- true` through kas minus p50 direct
                                            (N*5 each, interleaved, on the same real busybox pod)
Uncompressed size = the layer tar (the unpacked root filesystem), compressed = the gzip layer blob, both MiB.
Only the entries measured are replaced; the others in deploy.json are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures.k8s import Kubectl, cluster_assets
from tests.support import helm_deploy as hd
from tether_devenv.cluster import LocalCluster
from tether_devenv.oci import BUSYBOX_IMAGE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "deploy.json"


def record(figures: dict[str, tuple[float, str]]) -> None:
    """Replace the measured entries of deploy.json in place, append new ones, keep the others; print them."""
    entries = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    for entry in entries:
        if entry["metric"] in figures:
            entry["value"], entry["unit"] = figures[entry["metric"]]
    known = {entry["metric"] for entry in entries}
    entries += [{"metric": m, "value": v, "unit": u} for m, (v, u) in figures.items() if m not in known]
    RESULTS.write_text(json.dumps(entries, indent=2) + "\n")
    for metric, (value, unit) in figures.items():
        print(f"{metric}: {value} {unit}")


def image_sizes(force: bool, names: list[str]) -> None:
    args = [sys.executable, "-m", "tether_devenv.images", "--json", *(["--force"] if force else []), *names]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    figures: dict[str, tuple[float, str]] = {}
    for line in out.splitlines():
        image = json.loads(line)
        name = image["name"].replace("-", "_")  # front-proxy -> front_proxy_image_mib
        figures[f"{name}_image_mib"] = (round(image["uncompressed_bytes"] / 2**20, 1), "MiB")
        figures[f"{name}_image_compressed_mib"] = (round(image["compressed_bytes"] / 2**20, 1), "MiB")
    record(figures)


def _p50_ms(kubectl: Kubectl, pod: str) -> float:
    began = time.monotonic()
    kubectl.run("exec", "-n", hd.WORK_NS, pod, "--", "true")
    return (time.monotonic() - began) * 1000


def exec_added_ms(inst: hd.Installation, samples: int) -> tuple[float, float, float]:
    """(direct p50, through kas p50, added) in ms, interleaved on one busybox pod of the work namespace."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "exec-bench", "namespace": hd.WORK_NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    }
    inst.admin.run("apply", "-f", "-", input_text=json.dumps(pod))
    inst.admin.run("wait", "-n", hd.WORK_NS, "--for=condition=Ready", "pod/exec-bench", "--timeout=240s")
    kc = inst.proxy_kubectl()
    for kubectl in (inst.admin, kc):  # warm-up: discovery caches, kas' connection to agentk
        _p50_ms(kubectl, "exec-bench")
    direct, via_kas = [], []
    for _ in range(samples):
        direct.append(_p50_ms(inst.admin, "exec-bench"))
        via_kas.append(_p50_ms(kc, "exec-bench"))
    d, k = statistics.median(direct), statistics.median(via_kas)
    return d, k, k - d


async def upgrade_under_load(inst: hd.Installation) -> hd.LoadReport:
    async with hd.Load(inst, clients=20) as load:
        await asyncio.to_thread(hd.roll_out, inst, "bench")
    return load.report


def helm_figures(runs: int) -> None:
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", nodes=1, real_nodes=1)
        info = cluster.start()
        admin = Kubectl(cluster_assets()["kubectl"], info.kubeconfig)
        helm = None
        try:
            inst = hd.install(info, admin, Path(tmp) / "deploy", progress=print)
            helm = inst.helm
            ready_s = inst.timings["helm_install_to_agent_ready_seconds"]
            print(
                f"helm install tether: {inst.timings['helm_install_server_seconds']:.1f}s; agent ready {ready_s:.1f}s"
            )
            failovers = []
            for _ in range(runs):
                old, new, seconds = hd.fail_over(inst)
                print(f"leader {old} -> {new}: {seconds:.2f}s")
                failovers.append(seconds)
                hd.wait_until(lambda: len(inst.ready_pods(hd.AGENT_NS, "agentk")) == 2, hd.STEP_S, "two agentk")
            direct, via_kas, added = exec_added_ms(inst, runs * 5)
            print(f"kubectl exec true: direct p50 {direct:.0f} ms, through kas p50 {via_kas:.0f} ms")
            report = asyncio.run(upgrade_under_load(inst))
            print(f"rolling upgrade under 20 clients: {report}")
            record(
                {
                    "helm_install_to_agent_ready_seconds": (round(ready_s, 1), "s"),
                    "leader_failover_seconds": (round(statistics.median(failovers), 2), "s"),
                    "rolling_upgrade_failed_requests": (report.failed, "requests"),
                    "rolling_upgrade_requests": (report.requests, "requests"),
                    "real_pod_exec_added_ms": (round(added, 1), "ms"),
                }
            )
        finally:
            hd.remove_everything(admin, helm)
            cluster.stop()
    print(f"load average after: {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild every image (image sizes)")
    parser.add_argument("--helm", action="store_true", help="the Helm install figures on a real node (root)")
    parser.add_argument("--runs", type=int, default=3, help="leader failovers; exec samples are 5 times this")
    parser.add_argument("names", nargs="*", help="images to measure (default: every image)")
    args = parser.parse_args()
    if args.helm:
        helm_figures(args.runs)
    else:
        image_sizes(args.force, args.names)


if __name__ == "__main__":
    main()
