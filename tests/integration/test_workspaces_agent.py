"""The agentk half of remote_development against the real cluster and a real hub (no kas in between).

The same flows run through kas in ``tests/e2e/test_workspaces.py``; this test isolates the agent's
reconciler, applier and lease from the tunnel layer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.hub.test_workspaces_cli import run as cli
from tests.hub.workspace_helpers import (
    FAILING_DEVFILE,
    PV,
    REFUSED_DEVFILE,
    UPDATE,
    WorkspaceSetup,
    create,
    graphql,
    volumes,
    workspace_setup,
)
from tests.support.polling import poll
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.modules.remote_development.agent.applier import Applier
from tether.modules.remote_development.agent.worker import RemoteDevelopmentWorker, SyncSettings
from tether.modules.remote_development.hub.desired_config import render
from tether.modules.remote_development.protocol import INVENTORY_ID_LABEL, OWNING_INVENTORY
from tether_devenv.cluster import ClusterInfo

pytestmark = pytest.mark.k8s
SQLITE_ONLY = pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)


def direct_request(hub: RealHub, ws: WorkspaceSetup) -> Any:
    async def request(path: str, body: bytes) -> tuple[int, bytes]:
        url = f"{hub.api_url}/internal/kubernetes/modules/remote_development{path}"
        headers = {**hub.kas_headers(), "Gitlab-Agent-Api-Request": ws.agent_token, "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as response:
            return response.status, await response.read()

    return request


def state(hub: RealHub, name: str) -> dict[str, Any]:
    return hub.db.rows(
        "SELECT desired_state, actual_state, actual_state_message FROM workspaces WHERE name = :n", n=name
    )[0]


async def wait_state(hub: RealHub, name: str, actual: str, limit: float = 60.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        row = state(hub, name)
        return row if row["actual_state"] == actual else None

    return await poll(check, f"{name} actual state {actual} (now {state(hub, name)})", limit=limit, interval=0.2)


@SQLITE_ONLY
async def test_workspace_lifecycle_on_the_cluster(hub: RealHub, k8s_cluster: ClusterInfo, kubectl: Kubectl) -> None:
    ws = workspace_setup(hub)
    volumes(kubectl, 1)
    created = create(hub, ws, name="it-lifecycle")
    name, namespace = created["name"], created["namespace"]
    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    worker = RemoteDevelopmentWorker(kube, direct_request(hub, ws), ws.setup.agent_id, SyncSettings(True, 0.5, 3600))
    task = asyncio.create_task(worker.run())
    token = ws.setup.tokens["developer"]
    try:
        await wait_state(hub, name, "Running")
        deployment = kubectl.json("get", "deployment", name, "-n", namespace, "--show-managed-fields")
        assert deployment["metadata"]["labels"]["agent.gitlab.com/id"] == str(ws.setup.agent_id)
        inventory = kubectl.json("get", "configmap", f"{name}-workspace-inventory", "-n", namespace)
        assert f"{namespace}_{name}_apps_Deployment" in inventory["data"]
        managers = {m["manager"] for m in deployment["metadata"]["managedFields"]}
        assert "agentk" in managers

        graphql(hub, token, UPDATE, {"id": created["id"], "state": "Stopped"})
        await wait_state(hub, name, "Stopped")
        graphql(hub, token, UPDATE, {"id": created["id"], "state": "Running"})
        await wait_state(hub, name, "Running")
        graphql(hub, token, UPDATE, {"id": created["id"], "state": "RestartRequested"})
        await poll(
            lambda: asyncio.sleep(0, state(hub, name)["desired_state"] == "Running"),
            "restart flip",
            limit=60,
            interval=0.2,
        )
        await wait_state(hub, name, "Running")
        graphql(hub, token, UPDATE, {"id": created["id"], "state": "Terminated"})
        await wait_state(hub, name, "Terminated", limit=120)
        gone = kubectl.run("get", "namespace", namespace, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()


@SQLITE_ONLY
async def test_failing_image_and_refused_apply(hub: RealHub, k8s_cluster: ClusterInfo, kubectl: Kubectl) -> None:
    ws = workspace_setup(hub)
    volumes(kubectl, 2)
    failing = create(hub, ws, name="it-pull-fails", devfile=FAILING_DEVFILE)
    refused = create(hub, ws, name="it-refused", devfile=REFUSED_DEVFILE)
    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    worker = RemoteDevelopmentWorker(kube, direct_request(hub, ws), ws.setup.agent_id, SyncSettings(True, 0.5, 3600))
    task = asyncio.create_task(worker.run())
    try:
        row = await wait_state(hub, failing["name"], "Failed")
        assert row["actual_state_message"].startswith("ImagePullBackOff: Back-off pulling image")
        row = await wait_state(hub, refused["name"], "Error")
        assert "Deployment gl-rd-ns-" in row["actual_state_message"]
        assert "must be no more than 15 characters" in row["actual_state_message"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()


#: A data volume larger than the static volumes other tests leave behind: its claim waits until this test adds one.
BIG_VOLUME_DEVFILE = """schemaVersion: 2.2.0
components:
  - name: tooling
    container:
      image: registry.example/tools:1
  - name: data
    volume: {size: 321Gi}
"""


def start_worker(hub: RealHub, ws: WorkspaceSetup, kube: KubeClient, grace_s: float) -> asyncio.Task[None]:
    settings = SyncSettings(True, 0.5, 3600, unschedulable_grace_s=grace_s)
    return asyncio.create_task(
        RemoteDevelopmentWorker(kube, direct_request(hub, ws), ws.setup.agent_id, settings).run()
    )


async def stop_worker(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@SQLITE_ONLY
async def test_a_pod_waiting_for_its_volume_is_starting_and_fails_only_if_that_lasts(
    hub: RealHub, k8s_cluster: ClusterInfo, kubectl: Kubectl
) -> None:
    """Issue 23 item 4: Unschedulable while a claim binds is Starting with its reason; lasting, Failed; then Running.

    The claim has no volume to bind to until the test adds one (Immediate binding here; a WaitForFirstConsumer
    provisioner still at work looks the same to the workspace). Before the grace, agentk's report was Failed.
    """
    ws = workspace_setup(hub)
    created = create(hub, ws, name="it-unbound", devfile=BIG_VOLUME_DEVFILE)
    name = created["name"]
    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    task = start_worker(hub, ws, kube, grace_s=600)
    pv = f"ws-pv-big-{name}"
    try:

        async def waiting() -> dict[str, Any] | None:
            row = state(hub, name)
            assert row["actual_state"] != "Failed", row
            return row if "unbound immediate PersistentVolumeClaims" in row["actual_state_message"] else None

        row = await poll(waiting, "the workspace waiting for its claim", limit=60, interval=0.2)
        assert row["actual_state"] == "Starting", row
        assert row["actual_state_message"].startswith("Unschedulable: 0/1 nodes are available")
        assert row["actual_state_message"].endswith("(waiting: a failure if it lasts)")
        for _ in range(6):  # several partial runs (0.5 s apart): still Starting, never Failed
            await asyncio.sleep(0.5)
            assert state(hub, name)["actual_state"] == "Starting"
        # The same cause, lasting past the grace (a 1 s grace stands for a minute): Failed, with the same reason.
        await stop_worker(task)
        task = start_worker(hub, ws, kube, grace_s=1)
        row = await wait_state(hub, name, "Failed")
        assert row["actual_state_message"].startswith("Unschedulable: 0/1 nodes are available")
        assert "unbound immediate PersistentVolumeClaims" in row["actual_state_message"]
        # The cause goes away: the claim binds, the pod is scheduled, the workspace runs.
        kubectl.run("apply", "-f", "-", input_text=PV.format(name=pv).replace("50Gi", "321Gi"))
        row = await wait_state(hub, name, "Running", limit=120)
        assert row["actual_state_message"] == ""
    finally:
        await stop_worker(task)
        await kube.close()


@SQLITE_ONLY
async def test_an_error_workspace_runs_once_its_cause_is_fixed(
    hub: RealHub, k8s_cluster: ClusterInfo, kubectl: Kubectl
) -> None:
    """Issue 23 item 4: a quota refuses the Deployment (Error); once it is gone the workspace runs within a
    partial reconciliation (upstream waits for the hourly full one). ``--wait`` through it all: the failure
    with its reason, an Error that predates the wait and clears, a restart, a stop."""
    ws = workspace_setup(hub)
    volumes(kubectl, 1)
    token = ws.setup.tokens["developer"]
    name, namespace = "it-quota", f"gl-rd-ns-{ws.setup.agent_id}-it-quota"  # the hub's rule for a named one
    kubectl.run("create", "namespace", namespace)
    quota = "{kind: ResourceQuota, apiVersion: v1, metadata: {name: no-deployments}, spec: {hard: {%s: '0'}}}"
    kubectl.run("apply", "-n", namespace, "-f", "-", input_text=quota % "count/deployments.apps")
    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    task = start_worker(hub, ws, kube, grace_s=60)
    try:
        args = ("create", "--agent", str(ws.setup.agent_id), "--project", str(ws.setup.project_id), "--name", name)
        refused = await asyncio.to_thread(cli, hub, token, *args, "--wait", "--timeout", "60")
        assert refused.returncode == 1 and f"{name}: CreationRequested" in refused.stdout, refused
        assert f"{name} is Error, not Running: Deployment {namespace}/{name}: " in refused.stderr, refused
        assert "exceeded quota: no-deployments" in refused.stderr
        row = state(hub, name)
        assert row["actual_state_message"].endswith("it returns to its desired state once the cause is fixed)")
        number = str(hub.db.rows("SELECT id FROM workspaces WHERE name = :n", n=name)[0]["id"])
        await asyncio.sleep(2)  # several partial runs: each applies again and is refused again
        assert state(hub, name)["actual_state"] == "Error"

        # The cause goes: the Error that predates this wait does not end it; the next partial run clears it.
        kubectl.run("delete", "resourcequota", "no-deployments", "-n", namespace)
        waited = await asyncio.to_thread(cli, hub, token, "start", number, "--wait", "--timeout", "60")
        assert waited.returncode == 0, waited
        assert waited.stdout.splitlines()[-1] == f"{name}: Running", waited.stdout
        assert state(hub, name)["actual_state_message"] == ""

        # A restart is waited for until the workspace runs again (not at once, while it still runs).
        restarted = await asyncio.to_thread(cli, hub, token, "restart", number, "--wait", "--timeout", "60")
        assert restarted.returncode == 0 and restarted.stdout.splitlines()[-1] == f"{name}: Running", restarted
        assert state(hub, name)["desired_state"] == "Running"  # RestartRequested flipped: it did stop
        stopped = await asyncio.to_thread(cli, hub, token, "stop", number, "--wait", "--timeout", "60")
        assert stopped.returncode == 0 and stopped.stdout.splitlines()[-1] == f"{name}: Stopped", stopped
    finally:
        await stop_worker(task)
        await kube.close()
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


async def test_applier_prunes_what_an_inventory_no_longer_holds(
    k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str
) -> None:
    def config(names: list[str]) -> str:
        inventory = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "inv", "namespace": k8s_namespace, "labels": {INVENTORY_ID_LABEL: "inv"}},
        }
        objects = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": n, "namespace": k8s_namespace, "annotations": {OWNING_INVENTORY: "inv"}},
                "data": {"k": n},
            }
            for n in names
        ]
        return render([inventory, *objects])

    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    applier = Applier(kube)
    try:
        assert await applier.apply(config(["one", "two"]), k8s_namespace) == []
        assert {"one", "two"} <= {
            c["metadata"]["name"] for c in kubectl.json("get", "cm", "-n", k8s_namespace)["items"]
        }
        assert await applier.apply(config(["two"]), k8s_namespace) == []
        names = {c["metadata"]["name"] for c in kubectl.json("get", "cm", "-n", k8s_namespace)["items"]}
        assert "one" not in names and "two" in names
        inventory = kubectl.json("get", "cm", "inv", "-n", k8s_namespace)
        assert inventory["data"] == {f"{k8s_namespace}_two__ConfigMap": ""}
        assert await applier.apply(config([]), k8s_namespace) == []  # an empty inventory prunes everything it owned
        names = {c["metadata"]["name"] for c in kubectl.json("get", "cm", "-n", k8s_namespace)["items"]}
        assert "two" not in names and "inv" in names
        errors = await applier.apply(config(["x"]).replace("owning-inventory", "owner"), k8s_namespace)
        assert errors and "no owning inventory found" in errors[0]
        elsewhere = await applier.apply(config(["x"]), "kube-system")  # objects outside the workspace namespace
        assert elsewhere and "not in the workspace namespace" in elsewhere[0]
    finally:
        await kube.close()
