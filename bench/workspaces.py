"""Benchmark workspaces reconciliation (issue 12 acceptance figures), everything real on loopback.

Usage: ``uv run python bench/workspaces.py [--rss-workspaces 1000] [--samples 5]``

Set-up: a private cluster (``tether_devenv``), the hub (SQLite), ``tether kas`` and, for the end-to-end
figures, ``tether agentk`` with the agent's default intervals (partial 10 s, full 1 h).

* ``partial_reconcile_1000_ms`` (p50): agentk's request path without agentk: a partial reconcile reporting
  1,000 running workspaces (each Deployment with a new resourceVersion) sent through kas' ``gitlab_access``
  to the hub and answered; timed from send to the whole answer.
* ``full_reconcile_1000_ms`` (p50): the same with ``update_type: full``: every workspace is answered with its
  whole ``config_to_apply``.
* ``create_to_running_seconds`` (p50): GraphQL ``workspaceCreate`` -> the hub shows ``Running`` (agentk applies,
  kwok runs the pod, the next partial reports it).
* ``failure_to_failed_seconds`` (p50): the pod's container shows ``ImagePullBackOff`` in the API server -> the
  hub shows ``Failed``.
* ``agentk_rss_growth_1000_workspaces_mib``: agentk's RSS once it manages N workspaces (created through the
  hub, applied, watched and reported) minus its RSS with none. The bench cluster has no volume provisioner,
  so these workspaces' pods stay unschedulable (reported ``Failed``), which costs agentk the same memory.
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
from typing import Any

from grpc import aio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.system import System, write_private_secret
from tests.hub.helpers import kas_config, project_with_agent
from tests.hub.workspace_helpers import CREATE, DEVFILE, graphql
from tether.hub.service.principal import Principal
from tether.hub.workspaces import operations
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.modagent.gitlab_request import make_gitlab_request
from tether_devenv.assets import locate
from tether_devenv.cluster import LocalCluster

RESULTS = Path(__file__).parent / "results" / "workspaces.json"
CONFIG = "remote_development:\n  enabled: true\n  dns_zone: workspaces.example.com\n"
FAILING = DEVFILE.replace("registry.example/tools:1", "registry.tether.invalid/image-pull-fails:1")
PV = """apiVersion: v1
kind: PersistentVolume
metadata: {{name: {name}}}
spec:
  capacity: {{storage: 50Gi}}
  accessModes: [ReadWriteOnce]
  hostPath: {{path: /tmp/{name}}}
"""


def apply(kubectl: Path, kubeconfig: Path, manifest: str) -> None:
    """``kubectl apply`` a manifest (the bench's set-up; blocking is fine here)."""
    subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", "apply", "-f", "-"],
        input=manifest,
        text=True,
        check=True,
        capture_output=True,
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def bulk_create(hub: RealHub, user_id: int, project_id: int, agent_id: int, count: int, prefix: str) -> None:
    principal = Principal(user_id=user_id, username="developer", admin=False, scopes=frozenset({"api"}))

    async def work(session: Any) -> None:
        for i in range(count):
            await operations.create(
                session,
                principal,
                operations.CreateRequest(agent_id, project_id, "Running", devfile=DEVFILE, name=f"{prefix}-{i}"),
                user_limit=-1,  # set-up beyond the hub's default per-user limit
            )

    hub.db.session(work)


def deployment(name: str, namespace: str, rv: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv), "labels": {"app": name}},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
        "status": {
            "availableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        },
    }


async def reconcile_figures(hub: RealHub, kas_target: str, token: str, samples: int) -> list[dict[str, Any]]:
    rows = hub.db.rows("SELECT name, namespace FROM workspaces WHERE name LIKE 'bulk-%'")
    meta = (("authorization", f"Bearer {token}"),)
    results = []
    async with aio.insecure_channel(kas_target) as channel:

        async def send(update_type: str, rv: int) -> float:
            infos = [
                {
                    "name": r["name"],
                    "namespace": r["namespace"],
                    "latest_k8s_deployment_info": deployment(r["name"], r["namespace"], rv),
                }
                for r in rows
            ]
            body = json.dumps({"update_type": update_type, "workspace_agent_infos": infos}).encode()
            started = time.perf_counter()
            answer = await make_gitlab_request(
                channel, meta, "remote_development", "/reconcile", method="POST", body=body
            )
            elapsed = (time.perf_counter() - started) * 1000
            assert answer.status == 201, answer.body[:300]
            assert len(json.loads(answer.body)["workspace_rails_infos"]) == len(rows)
            return elapsed

        await send("full", 1)  # first report: states change from CreationRequested
        partial = [await send("partial", 2 + i) for i in range(samples * 4)]
        full = [await send("full", 100 + i) for i in range(samples * 2)]
    for name, values in (("partial_reconcile_1000_ms", partial), ("full_reconcile_1000_ms", full)):
        print(
            f"{name}: p50 {statistics.median(values):.0f} ms "
            f"(min {min(values):.0f}, max {max(values):.0f}, n={len(values)})"
        )
        results.append({"metric": name, "value": round(statistics.median(values), 1), "unit": "ms"})
    return results


def state(hub: RealHub, name: str) -> str:
    rows = hub.db.rows("SELECT actual_state FROM workspaces WHERE name = :n", n=name)
    return str(rows[0]["actual_state"]) if rows else ""


async def e2e_figures(hub: RealHub, setup: Any, kubectl: Path, kubeconfig: Path, samples: int) -> list[dict[str, Any]]:
    token = setup.tokens["developer"]
    kube = KubeClient(load_credentials(str(kubeconfig)))
    create_to_running: list[float] = []
    failure_to_failed: list[float] = []
    try:
        for i in range(samples):
            name = f"bench-run-{i}"
            await asyncio.to_thread(apply, kubectl, kubeconfig, PV.format(name="pv-" + name))
            started = time.perf_counter()
            variables = {
                "input": {
                    "clusterAgentId": str(setup.agent_id),
                    "projectId": str(setup.project_id),
                    "desiredState": "Running",
                    "devfile": DEVFILE,
                    "name": name,
                }
            }
            assert graphql(hub, token, CREATE, variables).json()["data"]["workspaceCreate"]["errors"] == []
            while state(hub, name) != "Running":
                await asyncio.sleep(0.05)
            create_to_running.append(time.perf_counter() - started)
            print(f"  create -> Running {create_to_running[-1]:.1f} s")
        for i in range(samples):
            name = f"bench-fail-{i}"
            await asyncio.to_thread(apply, kubectl, kubeconfig, PV.format(name="pv-" + name))
            variables = {
                "input": {
                    "clusterAgentId": str(setup.agent_id),
                    "projectId": str(setup.project_id),
                    "desiredState": "Running",
                    "devfile": FAILING,
                    "name": name,
                }
            }
            assert graphql(hub, token, CREATE, variables).json()["data"]["workspaceCreate"]["errors"] == []
            namespace = f"gl-rd-ns-{setup.agent_id}-{name}"
            reported = None
            while reported is None:
                pods = (
                    await kube.get_json(f"/api/v1/namespaces/{namespace}/pods") if state(hub, name) else {"items": []}
                )
                for pod in pods.get("items", []):
                    for status in pod.get("status", {}).get("containerStatuses") or []:
                        if (status.get("state", {}).get("waiting") or {}).get("reason") == "ImagePullBackOff":
                            reported = time.perf_counter()
                if reported is None:
                    await asyncio.sleep(0.05)
            while state(hub, name) != "Failed":
                await asyncio.sleep(0.05)
            failure_to_failed.append(time.perf_counter() - reported)
            print(f"  ImagePullBackOff -> Failed {failure_to_failed[-1]:.1f} s")
    finally:
        await kube.close()
    return [
        {"metric": "create_to_running_seconds", "value": round(statistics.median(create_to_running), 2), "unit": "s"},
        {"metric": "failure_to_failed_seconds", "value": round(statistics.median(failure_to_failed), 2), "unit": "s"},
    ]


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tether-ws-bench-") as tmp:
        directory = Path(tmp)
        cluster = LocalCluster(directory / "cluster", nodes=1)
        info = cluster.start()
        kubectl = locate()["kubectl"]
        launcher = HubLauncher(directory, f"sqlite+aiosqlite:///{directory / 'hub.db'}")
        hub = launcher.prepare()
        (directory / "system").mkdir()
        system = System(
            directory / "system", hub, write_private_secret(directory / "private_secret"), info.kubeconfig, None
        )
        try:
            kas = system.kas(use_redis=False)
            launcher.start(
                hub,
                # the developer owns 1,000 bulk workspaces beside the measured ones
                {"kas.api_address": kas.api_target, "workspaces.max_active_workspaces_per_user": -1},
            )
            setup = project_with_agent(hub, roles=("developer",))
            kas_config(hub, setup, CONFIG)
            agent_token = (
                hub.api()
                .post(f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens", json={"name": "a"})
                .json()["token"]
            )
            other = hub.api().post(f"/projects/{setup.project_id}/cluster_agents", json={"name": "bulk"}).json()
            hub.api().put(
                f"/projects/{setup.project_id}/cluster_agents/{other['id']}/configuration", content=CONFIG.encode()
            ).raise_for_status()
            other_token = (
                hub.api()
                .post(f"/projects/{setup.project_id}/cluster_agents/{other['id']}/tokens", json={"name": "b"})
                .json()["token"]
            )
            bulk_create(hub, setup.user_ids["developer"], setup.project_id, other["id"], 1000, "bulk")
            results += await reconcile_figures(
                hub, kas.agent_address.removeprefix("grpc://"), other_token, args.samples
            )

            apply(kubectl, info.kubeconfig, "apiVersion: v1\nkind: Namespace\nmetadata: {name: tether-system}\n")
            agentk = system.agentk(agent_token, kas)
            results += await e2e_figures(hub, setup, kubectl, info.kubeconfig, args.samples)

            await asyncio.sleep(12)
            before = rss_mib(agentk.process.pid)
            bulk_create(hub, setup.user_ids["developer"], setup.project_id, setup.agent_id, args.rss_workspaces, "rss")
            started = time.perf_counter()
            while True:
                waiting = hub.db.rows(
                    "SELECT count(*) AS n FROM workspaces "
                    "WHERE name LIKE 'rss-%' AND actual_state = 'CreationRequested'"
                )[0]["n"]
                if waiting == 0:
                    break
                await asyncio.sleep(2)
            await asyncio.sleep(12)  # one more partial cycle with everything watched
            growth = rss_mib(agentk.process.pid) - before
            print(
                f"agentk RSS growth with {args.rss_workspaces} workspaces: {growth:.1f} MiB "
                f"(all reported after {time.perf_counter() - started:.0f} s)"
            )
            results.append(
                {
                    "metric": f"agentk_rss_growth_{args.rss_workspaces}_workspaces_mib",
                    "value": round(growth, 1),
                    "unit": "MiB",
                }
            )
        finally:
            system.stop_all()
            launcher.stop_all()
            cluster.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rss-workspaces", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    results = asyncio.run(run(args))
    print(f"load average before: {load[0]:.2f}")
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
