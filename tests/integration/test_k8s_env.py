"""The local cluster is a real one: controllers, scheduler, kwok nodes, discovery, watch and SSA."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
import pytest

from tests.fixtures.k8s import Kubectl
from tests.support.polling import poll_sync
from tether_devenv.cluster import ClusterInfo

pytestmark = pytest.mark.k8s

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: registry.invalid/web:1
"""

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.tether.example.com
spec:
  group: tether.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"""


def test_deployment_becomes_available_on_kwok_nodes(kubectl: Kubectl, k8s_namespace: str) -> None:
    kubectl.run("apply", "-n", k8s_namespace, "-f", "-", input_text=DEPLOYMENT)

    def available() -> bool:
        status = kubectl.json("get", "deployment", "web", "-n", k8s_namespace)["status"]
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return conditions.get("Available") == "True" and status.get("availableReplicas") == 3

    poll_sync(available, "Deployment web to become Available with 3 replicas", 90, interval=0.5)
    pods = kubectl.json("get", "pods", "-n", k8s_namespace, "-l", "app=web")["items"]
    assert len(pods) == 3
    nodes = {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"


def test_crd_is_listed_by_discovery(kubectl: Kubectl, k8s_namespace: str) -> None:
    kubectl.run("apply", "-f", "-", input_text=CRD)
    try:

        def discovered() -> bool:
            result = kubectl.run("api-resources", "--api-group=tether.example.com", "-o", "name", check=False)
            return "widgets.tether.example.com" in result.stdout

        poll_sync(discovered, "the CRD to appear in discovery", 60, interval=0.5)
        group = json.loads(kubectl.run("get", "--raw", "/apis/tether.example.com/v1alpha1").stdout)
        assert [r["name"] for r in group["resources"]] == ["widgets"]
        widget = (
            '{"apiVersion":"tether.example.com/v1alpha1","kind":"Widget","metadata":{"name":"w1"},"spec":{"size":3}}'
        )
        kubectl.run("apply", "-n", k8s_namespace, "-f", "-", input_text=widget)
        assert kubectl.json("get", "widgets", "-n", k8s_namespace)["items"][0]["spec"]["size"] == 3
    finally:
        kubectl.run("delete", "crd", "widgets.tether.example.com", "--wait=false", check=False)


async def test_watch_delivers_added_modified_deleted(
    k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str
) -> None:
    listing = json.loads(kubectl.run("get", "--raw", f"/api/v1/namespaces/{k8s_namespace}/configmaps").stdout)
    start_rv = listing["metadata"]["resourceVersion"]
    ssl_context = ssl.create_default_context(cafile=str(k8s_cluster.ca_file))
    url = f"{k8s_cluster.server}/api/v1/namespaces/{k8s_namespace}/configmaps"
    params = {
        "watch": "1",
        "resourceVersion": start_rv,
        "fieldSelector": "metadata.name=c1",
        "allowWatchBookmarks": "false",
        "timeoutSeconds": "60",
    }
    headers = {"Authorization": f"Bearer {k8s_cluster.token}"}
    events: list[tuple[str, int]] = []

    async def consume() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params=params, headers=headers, ssl=ssl_context) as resp,
        ):
            assert resp.status == 200
            async for line in resp.content:
                event = json.loads(line)
                events.append((event["type"], int(event["object"]["metadata"]["resourceVersion"])))
                if event["type"] == "DELETED":
                    return

    watcher = asyncio.create_task(consume())
    await asyncio.sleep(0.5)
    await asyncio.to_thread(kubectl.run, "create", "configmap", "c1", "-n", k8s_namespace, "--from-literal=a=1")
    await asyncio.to_thread(kubectl.run, "patch", "configmap", "c1", "-n", k8s_namespace, "-p", '{"data":{"a":"2"}}')
    await asyncio.to_thread(kubectl.run, "delete", "configmap", "c1", "-n", k8s_namespace)
    await asyncio.wait_for(watcher, 60)

    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [rv for _, rv in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert versions[0] > int(start_rv)


def test_server_side_apply_creates_then_updates_with_field_manager(kubectl: Kubectl, k8s_namespace: str) -> None:
    manifest = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ssa"},"data":{"a":"%s"}}'
    args = ("apply", "--server-side", "--field-manager=tether-test", "-n", k8s_namespace, "-f", "-")
    kubectl.run(*args, input_text=manifest % "1")
    created = kubectl.json("get", "configmap", "ssa", "-n", k8s_namespace, "--show-managed-fields")
    kubectl.run(*args, input_text=manifest % "2")
    updated = kubectl.json("get", "configmap", "ssa", "-n", k8s_namespace, "--show-managed-fields")

    assert created["data"] == {"a": "1"} and updated["data"] == {"a": "2"}
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    managers = [(m["manager"], m["operation"]) for m in updated["metadata"]["managedFields"]]
    assert managers == [("tether-test", "Apply")]

    conflict = kubectl.run(
        "apply",
        "--server-side",
        "--field-manager=someone-else",
        "-n",
        k8s_namespace,
        "-f",
        "-",
        input_text=manifest % "3",
        check=False,
    )
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower()


def test_rbac_is_enforced(k8s_cluster: ClusterInfo, kubectl: Kubectl) -> None:
    allowed = kubectl.run("auth", "can-i", "delete", "pods", "--as=someone", check=False)
    assert allowed.stdout.strip() == "no"
    assert kubectl.run("auth", "can-i", "delete", "pods").stdout.strip() == "yes"
