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
from tests.hub.workspace_helpers import (
    FAILING_DEVFILE,
    REFUSED_DEVFILE,
    UPDATE,
    WorkspaceSetup,
    create,
    graphql,
    volumes,
    workspace_setup,
)
from tests.support.polling import poll
from tether.devenv.cluster import ClusterInfo
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.modules.remote_development.agent.applier import Applier
from tether.modules.remote_development.agent.worker import RemoteDevelopmentWorker, SyncSettings
from tether.modules.remote_development.desired_config import INVENTORY_ID_LABEL, OWNING_INVENTORY, render

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
