"""The Graph API engine against the real cluster: every seed 002 rule that can be observed end to end.

The engine runs in-process; each batch goes engine -> protobuf -> client JSON (the path kas relays) into
a client model that checks the wire rules on every action. Tests wait for conditions (with a generous
upper bound) and never assert on timing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures.k8s import Kubectl
from tests.graph.harness import EngineSession, GraphModel, exclude, include
from tether.kube.client import KubeClient
from tether.modules.graph.engine.engine import EngineOptions, GraphEngine
from tether.modules.graph.engine.model import VertexId
from tether.modules.graph.engine.request import parse_request
from tether.modules.graph.rpc.wire import response_to_json, response_to_proto

pytestmark = pytest.mark.k8s

CORE = (
    "group == '' && resource in ['pods', 'configmaps', 'secrets', 'serviceaccounts', 'services', "
    "'persistentvolumeclaims']"
)
APPS = "group == 'apps' && resource in ['deployments', 'replicasets']"


@pytest.fixture
def second_namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl.run("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def apply(kubectl: Kubectl, manifest: str) -> None:
    kubectl.run("apply", "-f", "-", input_text=manifest)


def has(resource: str, name: str, namespace: str = "", group: str | None = None):  # type: ignore[no-untyped-def]
    return lambda m: m.find(resource, name, namespace, group) is not None


def lacks(resource: str, name: str, namespace: str = ""):  # type: ignore[no-untyped-def]
    return lambda m: m.find(resource, name, namespace) is None


# ---- queries --------------------------------------------------------------------------------------------


async def test_queries_first_match_wins(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    kubectl.run("-n", ns, "create", "configmap", "cm", "--from-literal=a=b")
    kubectl.run("-n", ns, "create", "secret", "generic", "sec", "--from-literal=a=b")
    request = {"queries": [exclude("resource == 'secrets'"), include(CORE)], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(has("configmaps", "cm", ns), "configmap")
        await session.settle()
        assert session.model.find("secrets", "sec", ns) is None
        assert not session.model.names("deployments")
    reordered = {"queries": [include(CORE), exclude("resource == 'secrets'")], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, reordered) as session:
        await session.wait(has("secrets", "sec", ns), "secret included by the earlier include")


async def test_label_field_and_cel_object_filters(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    for name, tier in (("a", "web"), ("b", "web"), ("c", "db")):
        kubectl.run("-n", ns, "create", "configmap", name, f"--from-literal=size={name}")
        kubectl.run("-n", ns, "label", "configmap", name, f"tier={tier}")
    query = include(
        "resource == 'configmaps'",
        label_selector="tier=web",
        field_selector="metadata.name!=b",
        object_selector_expression=f"obj.data.size == 'a' && labels.tier == 'web' && namespace == '{ns}'",
    )
    async with EngineSession(kube, {"queries": [query], "namespaces": {"names": [ns]}}) as session:
        await session.wait(has("configmaps", "a", ns), "configmap a")
        await session.settle()
        assert session.model.names("configmaps", ns) == {"a"}
        # a change that makes the object fail the CEL filter removes it
        kubectl.run("-n", ns, "patch", "configmap", "a", "-p", '{"data":{"size":"other"}}')
        await session.wait(lacks("configmaps", "a", ns), "configmap a filtered out")


# ---- discovery, versions, CRDs --------------------------------------------------------------------------


def crd(group: str, plural: str, kind: str, versions: list[str], storage: str, scope: str = "Namespaced") -> str:
    entries = "".join(
        f"""
  - name: {v}
    served: true
    storage: {str(v == storage).lower()}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true"""
        for v in versions
    )
    return f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: {scope}
  names:
    plural: {plural}
    singular: {plural[:-1]}
    kind: {kind}
  versions:{entries}
"""


@pytest.fixture
def crd_group(kubectl: Kubectl) -> Iterator[str]:
    group = f"g{uuid.uuid4().hex[:8]}.tether.test"
    try:
        yield group
    finally:
        for plural in ("widgets", "gadgets", "gizmos"):
            kubectl.run("delete", "crd", f"{plural}.{group}", "--wait=false", "--ignore-not-found", check=False)


async def test_version_selection_and_crd_objects(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, crd_group: str
) -> None:
    ns = k8s_namespace
    apply(kubectl, crd(crd_group, "widgets", "Widget", ["v1beta1", "v1", "v2alpha1", "v10beta1"], storage="v1"))
    apply(kubectl, crd(crd_group, "gadgets", "Gadget", ["v1alpha1", "v2beta1", "v10beta1"], storage="v2beta1"))
    kubectl.run("wait", "--for=condition=Established", f"crd/widgets.{crd_group}", f"crd/gadgets.{crd_group}")
    apply(kubectl, f"apiVersion: {crd_group}/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: {ns}\n")
    apply(kubectl, f"apiVersion: {crd_group}/v2beta1\nkind: Gadget\nmetadata:\n  name: g1\n  namespace: {ns}\n")
    request = {"queries": [include(f"group == '{crd_group}'")], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(
            lambda m: m.names("widgets", ns) == {"w1"} and m.names("gadgets", ns) == {"g1"}, "CRD objects"
        )
        await session.settle()
        versions = {(k[2], k[1]) for k in session.model.vertices}
        # newest stable beats newer unstable ones; without stable: newest unstable, natural order (v10 > v2)
        assert versions == {("widgets", "v1"), ("gadgets", "v10beta1")}
    # excluding the stable version: the newest unstable one of the included versions
    request = {
        "queries": [exclude("version == 'v1'"), include(f"group == '{crd_group}' && resource == 'widgets'")],
        "namespaces": {"names": [ns]},
    }
    async with EngineSession(kube, request) as session:
        await session.wait(has("widgets", "w1", ns), "widget")
        assert {k[1] for k in session.model.vertices} == {"v10beta1"}


async def test_crd_created_while_watching_is_discovered(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, crd_group: str
) -> None:
    ns = k8s_namespace
    request = {"queries": [include(f"group == '{crd_group}'")], "namespaces": {"names": [ns]}}
    options = EngineOptions(sync_timeout_s=20.0, rediscovery_debounce_s=0.2)
    async with EngineSession(kube, request, options) as session:
        await session.settle()
        apply(kubectl, crd(crd_group, "gizmos", "Gizmo", ["v1"], storage="v1"))
        kubectl.run("wait", "--for=condition=Established", f"crd/gizmos.{crd_group}")
        apply(kubectl, f"apiVersion: {crd_group}/v1\nkind: Gizmo\nmetadata:\n  name: z1\n  namespace: {ns}\n")
        await session.wait(has("gizmos", "z1", ns), "object of a CRD created after the request")
        kubectl.run("delete", "crd", f"gizmos.{crd_group}")
        await session.wait(lacks("gizmos", "z1", ns), "objects of a deleted CRD removed")


async def test_cohabitation_groups_are_never_watched(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    apply(
        kubectl,
        f"""
apiVersion: v1
kind: Event
metadata:
  name: ev1
  namespace: {ns}
involvedObject:
  kind: ConfigMap
  name: cm
  namespace: {ns}
  apiVersion: v1
reason: Test
message: hello
type: Normal
""",
    )
    kubectl.run("-n", ns, "create", "configmap", "cm")
    request = {"queries": [include("resource in ['events', 'configmaps']")], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(has("events", "ev1", ns), "core event")
        await session.settle()
        assert {k[0] for k in session.model.vertices if k[2] == "events"} == {""}  # never events.k8s.io
        event = session.model.find("events", "ev1", ns)
        assert session.model.arc(event, session.model.find("configmaps", "cm", ns), "r") == {}


# ---- namespaces -----------------------------------------------------------------------------------------


async def test_namespace_list_mode(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, second_namespace: str
) -> None:
    for ns in (k8s_namespace, second_namespace):
        kubectl.run("-n", ns, "create", "configmap", "cm")
    request = {"queries": [include("resource == 'configmaps'")], "namespaces": {"names": [k8s_namespace]}}
    async with EngineSession(kube, request) as session:
        await session.wait(has("configmaps", "cm", k8s_namespace), "configmap in listed namespace")
        await session.settle()
        assert {k[3] for k in session.model.vertices} == {k8s_namespace}


async def test_namespace_list_mode_with_cel(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, second_namespace: str
) -> None:
    first, second = k8s_namespace, second_namespace
    for ns in (first, second):
        kubectl.run("-n", ns, "create", "configmap", "cm")
    kubectl.run("label", "namespace", first, "pick=yes")
    request = {
        "queries": [include("resource == 'configmaps'")],
        "namespaces": {"names": [first, second], "object_selector_expression": "'pick' in labels"},
    }
    async with EngineSession(kube, request) as session:
        await session.wait(has("configmaps", "cm", first), "first namespace")
        await session.settle()
        assert session.model.find("configmaps", "cm", second) is None
        kubectl.run("label", "namespace", second, "pick=yes")
        await session.wait(has("configmaps", "cm", second), "namespace that started to match")
        kubectl.run("label", "namespace", first, "pick-")
        await session.wait(lacks("configmaps", "cm", first), "namespace that stopped matching")


async def test_all_namespaces_label_selector_and_new_namespace(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, second_namespace: str
) -> None:
    marker = uuid.uuid4().hex[:8]
    kubectl.run("label", "namespace", k8s_namespace, f"graph-test={marker}")
    for ns in (k8s_namespace, second_namespace):
        kubectl.run("-n", ns, "create", "configmap", "cm")
    request = {
        "queries": [include("resource == 'configmaps'")],
        "namespaces": {"label_selector": f"graph-test={marker}"},
    }
    async with EngineSession(kube, request) as session:
        await session.wait(has("configmaps", "cm", k8s_namespace), "labelled namespace")
        await session.settle()
        assert session.model.find("configmaps", "cm", second_namespace) is None
        third = f"t-{uuid.uuid4().hex[:10]}"
        kubectl.run("create", "namespace", third)
        try:
            kubectl.run("label", "namespace", third, f"graph-test={marker}")
            kubectl.run("-n", third, "create", "configmap", "late")
            await session.wait(has("configmaps", "late", third), "namespace appearing while watching")
            kubectl.run("delete", "namespace", third, "--wait=false")
            await session.wait(lacks("configmaps", "late", third), "namespace disappearing while watching")
        finally:
            kubectl.run("delete", "namespace", third, "--wait=false", "--ignore-not-found", check=False)


@pytest.mark.parametrize("mode", ["field_selector", "object_selector_expression"])
async def test_all_namespaces_field_selector_and_cel(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, second_namespace: str, mode: str
) -> None:
    for ns in (k8s_namespace, second_namespace):
        kubectl.run("-n", ns, "create", "configmap", "cm")
    namespaces = (
        {"field_selector": f"metadata.name={k8s_namespace}"}
        if mode == "field_selector"
        else {"object_selector_expression": f"name == '{k8s_namespace}' && obj.metadata.name == name"}
    )
    request = {"queries": [include("resource == 'configmaps'")], "namespaces": namespaces}
    async with EngineSession(kube, request) as session:
        await session.wait(has("configmaps", "cm", k8s_namespace), "selected namespace")
        await session.settle()
        assert {k[3] for k in session.model.vertices} == {k8s_namespace}


async def test_cluster_wide_without_namespace_filter(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, second_namespace: str
) -> None:
    marker = uuid.uuid4().hex[:8]
    for ns in (k8s_namespace, second_namespace):
        kubectl.run("-n", ns, "create", "configmap", f"cm-{marker}")
    query = include(
        "resource in ['configmaps', 'namespaces']",
        object_selector_expression=f"name.endsWith('{marker}') || resource == 'namespaces'",
    )
    async with EngineSession(kube, {"queries": [query]}) as session:
        await session.wait(
            lambda m: {k[3] for k in m.vertices if k[2] == "configmaps"} == {k8s_namespace, second_namespace},
            "configmaps of both namespaces",
        )
        await session.settle()
        namespace = session.model.find("namespaces", k8s_namespace)
        assert namespace is not None and namespace[3] == ""  # cluster-scoped: no ns
        assert "ns" not in session.model.vertices[namespace]["vx"]


# ---- arcs -----------------------------------------------------------------------------------------------


async def test_owner_reference_arcs_with_attributes(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    kubectl.run("-n", ns, "create", "deployment", "web", "--image=nginx", "--replicas=2")
    kubectl.run("-n", ns, "create", "configmap", "owner")
    uid = kubectl.json("-n", ns, "get", "configmap", "owner")["metadata"]["uid"]
    apply(
        kubectl,
        f"""
apiVersion: v1
kind: ConfigMap
metadata:
  name: dependent
  namespace: {ns}
  ownerReferences:
  - apiVersion: v1
    kind: ConfigMap
    name: owner
    uid: {uid}
""",
    )
    request = {"queries": [include(CORE), include(APPS)], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(lambda m: len(m.names("pods", ns)) == 2 and m.names("replicasets", ns), "deployment tree")
        await session.settle()
        model = session.model
        deployment = model.find("deployments", "web", ns)
        (replicaset_name,) = model.names("replicasets", ns)
        replicaset = model.find("replicasets", replicaset_name, ns)
        assert model.arc(replicaset, deployment, "or") == {"c": True, "b": True}
        for pod in model.names("pods", ns):
            assert model.arc(model.find("pods", pod, ns), replicaset, "or") == {"c": True, "b": True}
        assert model.arc(model.find("configmaps", "dependent", ns), model.find("configmaps", "owner", ns), "or") == {}
        # deleting the dependent's pods: arcs go with them, the controller recreates pods with new arcs
        pod = sorted(model.names("pods", ns))[0]
        kubectl.run("-n", ns, "delete", "pod", pod, "--wait=false")
        await session.wait(lacks("pods", pod, ns), "deleted pod")
        assert not any(s[4] == pod for (s, _, _) in model.arcs)


async def test_reference_arcs_and_missing_destination(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    apply(
        kubectl,
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: {ns}
  labels: {{app: web}}
spec:
  serviceAccountName: default
  containers:
  - name: c
    image: nginx
    envFrom:
    - configMapRef: {{name: later}}
    env:
    - name: S
      valueFrom: {{secretKeyRef: {{name: creds, key: k, optional: true}}}}
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: data}}
---
apiVersion: v1
kind: Secret
metadata:
  name: creds
  namespace: {ns}
stringData: {{k: v}}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {ns}
spec:
  selector: {{app: web}}
  ports: [{{port: 80}}]
""",
    )
    request = {"queries": [include(CORE)], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(has("pods", "app", ns), "pod")
        await session.settle()
        model = session.model
        pod = model.find("pods", "app", ns)
        later = ("", "v1", "configmaps", ns, "later")
        assert model.arc(pod, later, "r") == {"e": True}  # destination does not exist (yet)
        assert model.arc(pod, ("", "v1", "persistentvolumeclaims", ns, "data"), "r") == {"e": True}
        assert model.arc(pod, model.find("secrets", "creds", ns), "r") == {}
        assert model.arc(pod, model.find("serviceaccounts", "default", ns), "r") == {}
        assert model.arc(model.find("services", "web", ns), pod, "t") == {}  # label selector
        kubectl.run("-n", ns, "create", "configmap", "later")
        await session.wait(lambda m: m.arc(pod, later, "r") == {}, "e cleared once the destination exists")
        kubectl.run("-n", ns, "label", "pod", "app", "app=other", "--overwrite")
        await session.wait(lambda m: m.arc(m.find("services", "web", ns), pod, "t") is None, "selector arc removed")


# ---- roots ----------------------------------------------------------------------------------------------


async def _deployment_with_config(kubectl: Kubectl, ns: str) -> None:
    apply(
        kubectl,
        f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: config, namespace: {ns}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: unrelated, namespace: {ns}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: c
        image: nginx
        envFrom: [{{configMapRef: {{name: config}}}}]
""",
    )


async def test_roots_directed(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    await _deployment_with_config(kubectl, ns)
    request = {
        "queries": [include(CORE), include(APPS)],
        "namespaces": {"names": [ns]},
        "roots": {"object_selector_expressions": ["group == 'apps' && resource == 'deployments' && name == 'web'"]},
    }
    async with EngineSession(kube, request) as session:
        await session.wait(has("configmaps", "config", ns), "deployment's config")
        await session.wait(
            lambda _: (
                session.engine.graph.nodes and any(VertexId(*k).resource == "pods" for k in session.engine.graph.nodes)
            ),
            "pods in the graph",
        )
        await session.settle()
        # only what the root reaches following arc direction: no ReplicaSet/Pods (their arcs point to it)
        assert {k[2] for k in session.model.vertices} == {"deployments", "configmaps", "serviceaccounts"}
        assert session.model.find("configmaps", "unrelated", ns) is None


async def test_roots_ignore_arc_direction(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    await _deployment_with_config(kubectl, ns)
    request = {
        "queries": [include(CORE), include(APPS)],
        "namespaces": {"names": [ns]},
        "roots": {
            "object_selector_expressions": ["resource == 'deployments' && name == 'web'"],
            "ignore_arc_direction": ["or"],
        },
    }
    async with EngineSession(kube, request) as session:
        await session.wait(
            lambda m: m.names("pods", ns) and m.names("replicasets", ns), "pods through reversed or arcs"
        )
        await session.settle()
        assert session.model.find("configmaps", "unrelated", ns) is None
        assert session.model.find("configmaps", "config", ns) is not None


async def test_root_appearing_and_disappearing(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    kubectl.run("-n", ns, "create", "configmap", "target")
    request = {
        "queries": [include(CORE)],
        "namespaces": {"names": [ns]},
        "roots": {"object_selector_expressions": ["resource == 'pods' && labels.role == 'root'"]},
    }
    pod = f"""
apiVersion: v1
kind: Pod
metadata: {{name: root, namespace: {ns}, labels: {{role: root}}}}
spec:
  containers: [{{name: c, image: nginx, envFrom: [{{configMapRef: {{name: target}}}}]}}]
"""
    async with EngineSession(kube, request) as session:
        await session.settle()
        assert not session.model.vertices  # no root yet: nothing is visible
        apply(kubectl, pod)
        await session.wait(
            lambda m: "target" in m.names("configmaps", ns) and m.names("pods", ns) == {"root"}, "root and target"
        )
        assert session.model.names("configmaps", ns) == {"target", "kube-root-ca.crt"}  # the pod's projected volume
        kubectl.run("-n", ns, "label", "pod", "root", "role=other", "--overwrite")
        await session.wait(lambda m: not m.vertices and not m.arcs, "everything invisible once the root is gone")
        kubectl.run("-n", ns, "label", "pod", "root", "role=root", "--overwrite")
        await session.wait(lambda m: "target" in m.names("configmaps", ns), "root again")
        kubectl.run("-n", ns, "delete", "pod", "root", "--wait=false", "--grace-period=0", "--force")
        await session.wait(lambda m: not m.vertices and not m.arcs, "root deleted")


# ---- projection, secrets --------------------------------------------------------------------------------


async def test_o_versus_j_and_secrets(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    secret_value = f"s3cr3t-{uuid.uuid4().hex}"
    kubectl.run("-n", ns, "create", "configmap", "cm", "--from-literal=key=value")
    kubectl.run("-n", ns, "create", "secret", "generic", "sec", f"--from-literal=password={secret_value}")
    request = {
        "queries": [
            include("resource == 'configmaps'", json_path="{.data.key}"),
            include("resource == 'secrets'", json_path="{.data}"),
            include("resource == 'serviceaccounts'"),
            include("resource == 'pods'", json_path="{.nothing}"),
        ],
        "namespaces": {"names": [ns]},
    }
    kubectl.run("-n", ns, "run", "p", "--image=nginx")
    async with EngineSession(kube, request) as session:
        await session.wait(has("secrets", "sec", ns), "secret")
        await session.wait(has("pods", "p", ns), "pod")
        await session.settle()
        model = session.model
        assert model.vertices[model.find("configmaps", "cm", ns)] == {
            "vx": {"g": "", "v": "v1", "r": "configmaps", "ns": ns, "n": "cm"},
            "j": ["value"],
        }
        service_account = model.vertices[model.find("serviceaccounts", "default", ns)]
        assert (
            "o" in service_account and "j" not in service_account and service_account["o"]["kind"] == "ServiceAccount"
        )
        assert "managedFields" not in service_account["o"]["metadata"]
        assert set(model.vertices[model.find("pods", "p", ns)]) == {"vx"}  # empty j is omitted
        assert set(model.vertices[model.find("secrets", "sec", ns)]) == {"vx"}  # never content
    encoded = base64.b64encode(secret_value.encode())
    assert not any(encoded in raw or secret_value.encode() in raw for raw in session.model.raw)
    request = {"queries": [include("resource == 'secrets'")], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(has("secrets", "sec", ns), "secret without json_path")
        assert set(session.model.vertices[session.model.find("secrets", "sec", ns)]) == {"vx"}
    assert not any(encoded in raw for raw in session.model.raw)


# ---- warnings -------------------------------------------------------------------------------------------


async def test_informer_sync_failed_warning(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    kubectl.run("-n", ns, "create", "configmap", "cm")
    request = {
        "queries": [
            include("resource == 'configmaps'", field_selector="spec.unsupported=x"),
            include("resource == 'serviceaccounts'"),
        ],
        "namespaces": {"names": [ns]},
    }
    async with EngineSession(kube, request, EngineOptions(sync_timeout_s=2.0)) as session:
        await session.wait(lambda m: "INFORMER_SYNC_FAILED" in m.warning_types(), "sync failure warning")
        (warning,) = [w for w in session.model.warnings if w["t"] == "INFORMER_SYNC_FAILED"]
        assert warning["a"] == {"g": "", "v": "v1", "r": "configmaps", "ns": ns}
        assert "field label not supported" in warning["m"] or "BadRequest" in warning["m"]
        await session.wait(has("serviceaccounts", "default", ns), "other resources still delivered")


async def test_object_processing_failed_warning(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    kubectl.run("-n", ns, "create", "configmap", "good", "--from-literal=x=1")
    kubectl.run("-n", ns, "create", "configmap", "bad")
    query = include("resource == 'configmaps'", object_selector_expression="obj.data.x == '1'")
    async with EngineSession(kube, {"queries": [query], "namespaces": {"names": [ns]}}) as session:
        await session.wait(has("configmaps", "good", ns), "good configmap")
        await session.wait(lambda m: "OBJECT_PROCESSING_FAILED" in m.warning_types(), "processing warning")
        warning = next(w for w in session.model.warnings if w["t"] == "OBJECT_PROCESSING_FAILED")
        assert warning["a"]["g"] == "" and warning["a"]["v"] == "v1" and warning["a"]["r"] == "configmaps"
        assert warning["a"]["ns"] == ns and warning["a"]["n"] in ("bad", "kube-root-ca.crt")
        assert session.model.find("configmaps", "bad", ns) is None


#: Expressions that fail on a Secret with its value (base64 or decoded) in the CEL error (issue 9 item 1).
SECRET_LEAKING_EXPRESSIONS = (
    "{'k': true}[obj.data.password]",
    "{'k': true}[string(base64.decode(obj.data.password))]",
    "'abc'.matches(string(base64.decode(obj.data.password)))",
    "int(string(base64.decode(obj.data.password))) > 0",
)


@pytest.mark.parametrize("where", ["object_selector_expression", "roots"])
@pytest.mark.parametrize("expression", SECRET_LEAKING_EXPRESSIONS)
async def test_object_processing_failed_never_carries_secret_values(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str, expression: str, where: str
) -> None:
    ns = k8s_namespace
    plain = f"s3cr3t-(unbalanced-{uuid.uuid4().hex}"  # "(" also makes the value an invalid regular expression
    encoded = base64.b64encode(plain.encode()).decode()
    kubectl.run("-n", ns, "create", "secret", "generic", "sec", f"--from-literal=password={plain}")
    if where == "roots":
        query = include("resource == 'secrets'")
        request = {
            "queries": [query],
            "namespaces": {"names": [ns]},
            "roots": {"object_selector_expressions": [expression]},
        }
    else:
        query = include("resource == 'secrets'", object_selector_expression=expression)
        request = {"queries": [query], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(lambda m: "OBJECT_PROCESSING_FAILED" in m.warning_types(), "processing warning")
        await session.settle()
    warnings = [w for w in session.model.warnings if w["t"] == "OBJECT_PROCESSING_FAILED"]
    assert any(w["a"].get("n") == "sec" and w["a"]["r"] == "secrets" for w in warnings), warnings
    for raw in session.model.raw:
        for needle in (plain, encoded, plain[:16], encoded[:16]):
            assert needle.encode() not in raw, f"{needle!r} leaked through {raw[:300]!r}"
    assert all("Secret" in w["m"] for w in warnings if w["a"]["r"] == "secrets"), warnings


async def test_namespace_list_failed_warning(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    request = {
        "queries": [include("resource == 'configmaps'")],
        "namespaces": {"names": [ns], "object_selector_expression": "labels.absent == 'x'"},
    }
    async with EngineSession(kube, request) as session:
        await session.wait(lambda m: "NAMESPACE_LIST_FAILED" in m.warning_types(), "namespace warning")
        warning = next(w for w in session.model.warnings if w["t"] == "NAMESPACE_LIST_FAILED")
        assert warning["a"] == {"ns": ns}
        await session.settle()
        assert not session.model.vertices


async def test_discovery_failed_warning(kube: KubeClient, kubectl: Kubectl) -> None:
    name = f"v1.g{uuid.uuid4().hex[:8]}.tether.test"
    group = name[3:]
    apply(
        kubectl,
        f"""
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {name}}}
spec:
  group: {group}
  version: v1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service: {{name: does-not-exist, namespace: default}}
""",
    )
    try:
        request = {"queries": [include(f"group == '{group}'")]}
        async with EngineSession(
            kube, request, EngineOptions(sync_timeout_s=5.0, rediscovery_interval_s=1.0, rediscovery_debounce_s=0.1)
        ) as session:
            await session.wait(
                lambda m: any(w["t"] == "DISCOVERY_FAILED" and group in w["m"] for w in m.warnings), "discovery warning"
            )
            warning = next(w for w in session.model.warnings if w["t"] == "DISCOVERY_FAILED")
            assert "a" not in warning
    finally:
        kubectl.run("delete", "apiservice", name, check=False)


def model_is_consistent(model: GraphModel) -> bool:
    return all(s in model.vertices for (s, _, _) in model.arcs)


async def test_every_arc_source_is_a_sent_vertex(kube: KubeClient, kubectl: Kubectl, k8s_namespace: str) -> None:
    ns = k8s_namespace
    await _deployment_with_config(kubectl, ns)
    request = {"queries": [include(CORE), include(APPS)], "namespaces": {"names": [ns]}}
    async with EngineSession(kube, request) as session:
        await session.wait(lambda m: m.names("pods", ns), "pods")
        await session.settle()
        assert model_is_consistent(session.model)
        kubectl.run("-n", ns, "delete", "deployment", "web", "--wait=false")
        await session.wait(lambda m: not m.names("deployments", ns), "deployment deleted")
        await session.settle()
        assert model_is_consistent(session.model)


# ---- flow control ---------------------------------------------------------------------------------------


async def test_a_slow_client_bounds_the_pending_vertices_without_sync_warnings(
    kube: KubeClient, kubectl: Kubectl, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    items = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}} for i in range(60)]
    kubectl.run(
        "-n", ns, "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    request = {"queries": [include("resource == 'configmaps'")], "namespaces": {"names": [ns]}}
    options = EngineOptions(sync_timeout_s=1.0, max_pending_vertices=10)
    engine = GraphEngine(kube, parse_request(json.dumps(request)), options)
    model = GraphModel()
    most_pending = 0
    async with engine:
        while len(model.names("configmaps", ns)) < 61:  # and kube-root-ca.crt
            await asyncio.sleep(0.2)  # a client that takes one message per 200 ms
            most_pending = max(most_pending, len(engine.graph.changes.vertices))
            batch = await asyncio.wait_for(engine.next_batch(), 30)
            model.apply(response_to_json(response_to_proto(batch.actions, batch.warnings)))
    assert most_pending <= 10
    assert "INFORMER_SYNC_FAILED" not in model.warning_types()
