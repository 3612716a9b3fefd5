"""Arc extraction per kind (seed 002 "Types of arcs"; the table in docs/graph.md)."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest

from tether.kube.discovery import ApiResource
from tether.modules.graph.engine.arcs import ExtractionError, extract
from tether.modules.graph.engine.model import ATTR_BLOCK_OWNER_DELETION, ATTR_CONTROLLER, VertexId
from tether.modules.graph.engine.request import parse_request
from tether.modules.graph.engine.selection import Selection, select_resources

V = frozenset({"list", "watch"})
RESOURCES = [
    ApiResource("", "v1", "pods", "Pod", True, V),
    ApiResource("", "v1", "configmaps", "ConfigMap", True, V),
    ApiResource("", "v1", "secrets", "Secret", True, V),
    ApiResource("", "v1", "serviceaccounts", "ServiceAccount", True, V),
    ApiResource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, V),
    ApiResource("", "v1", "persistentvolumes", "PersistentVolume", False, V),
    ApiResource("", "v1", "services", "Service", True, V),
    ApiResource("", "v1", "nodes", "Node", False, V),
    ApiResource("", "v1", "endpoints", "Endpoints", True, V),
    ApiResource("", "v1", "events", "Event", True, V),
    ApiResource("apps", "v1", "deployments", "Deployment", True, V),
    ApiResource("apps", "v1", "replicasets", "ReplicaSet", True, V),
    ApiResource("apps", "v1", "statefulsets", "StatefulSet", True, V),
    ApiResource("batch", "v1", "jobs", "Job", True, V),
    ApiResource("batch", "v1", "cronjobs", "CronJob", True, V),
    ApiResource("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, V),
    ApiResource("networking.k8s.io", "v1", "ingresses", "Ingress", True, V),
    ApiResource("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False, V),
    ApiResource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, V),
    ApiResource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, V),
    ApiResource("rbac.authorization.k8s.io", "v1", "roles", "Role", True, V),
    ApiResource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, V),
    ApiResource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, V),
    ApiResource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, V),
    ApiResource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, V),
    ApiResource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, V),
    ApiResource(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        V,
    ),
    ApiResource("apiregistration.k8s.io", "v1", "apiservices", "APIService", False, V),
    ApiResource("source.toolkit.fluxcd.io", "v1", "gitrepositories", "GitRepository", True, V),
    ApiResource("source.toolkit.fluxcd.io", "v1", "helmrepositories", "HelmRepository", True, V),
    ApiResource("source.toolkit.fluxcd.io", "v1", "helmcharts", "HelmChart", True, V),
    ApiResource("source.toolkit.fluxcd.io", "v1beta2", "ocirepositories", "OCIRepository", True, V),
    ApiResource("kustomize.toolkit.fluxcd.io", "v1", "kustomizations", "Kustomization", True, V),
    ApiResource("helm.toolkit.fluxcd.io", "v2", "helmreleases", "HelmRelease", True, V),
    ApiResource("notification.toolkit.fluxcd.io", "v1", "receivers", "Receiver", True, V),
    ApiResource("notification.toolkit.fluxcd.io", "v1beta3", "alerts", "Alert", True, V),
    ApiResource("notification.toolkit.fluxcd.io", "v1beta3", "providers", "Provider", True, V),
]


def selection(expression: str = "true") -> Selection:
    request = parse_request(json.dumps({"queries": [{"include": {"resource_selector_expression": expression}}]}))
    return select_resources(RESOURCES, request.queries)


SEL = selection()


def vx(resource: str, name: str, namespace: str = "ns") -> VertexId:
    watched = SEL.by_resource(_GROUPS[resource], resource)
    assert watched is not None
    return VertexId(watched.group, watched.version, resource, namespace if watched.namespaced else "", name)


_GROUPS = {r.resource: r.group for r in RESOURCES}


def refs_of(resource: str, obj: dict[str, Any], sel: Selection = SEL) -> dict[tuple[VertexId, str], int]:
    watched = sel.by_resource(_GROUPS[resource], resource)
    assert watched is not None
    obj.setdefault("metadata", {}).setdefault("namespace", "ns")
    obj["metadata"].setdefault("name", "self")
    return extract(watched, obj, sel).refs


POD_SPEC: dict[str, Any] = {
    "volumes": [
        {"name": "a", "configMap": {"name": "cm-vol"}},
        {"name": "b", "secret": {"secretName": "sec-vol"}},
        {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "d", "projected": {"sources": [{"configMap": {"name": "cm-proj"}}, {"secret": {"name": "sec-proj"}}]}},
        {"name": "e", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "sec-csi"}}},
        {"name": "f", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
    ],
    "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-init"}}]}],
    "containers": [
        {
            "name": "c",
            "envFrom": [{"secretRef": {"name": "sec-envfrom"}}, {"configMapRef": {"name": "cm-vol"}}],
            "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "k"}}},
                {"name": "C", "value": "plain"},
            ],
        }
    ],
    "imagePullSecrets": [{"name": "pull"}],
    "serviceAccountName": "sa",
    "nodeName": "node-1",
}

POD_TARGETS = {
    ("configmaps", "cm-vol"),
    ("secrets", "sec-vol"),
    ("persistentvolumeclaims", "data"),
    ("configmaps", "cm-proj"),
    ("secrets", "sec-proj"),
    ("secrets", "sec-csi"),
    ("configmaps", "cm-init"),
    ("secrets", "sec-envfrom"),
    ("configmaps", "cm-env"),
    ("secrets", "sec-env"),
    ("secrets", "pull"),
    ("serviceaccounts", "sa"),
}


def targets(refs: dict[tuple[VertexId, str], int], arc_type: str = "r") -> set[tuple[str, str]]:
    return {(v.resource, v.name) for (v, t) in refs if t == arc_type}


def test_pod_references() -> None:
    refs = refs_of("pods", {"metadata": {"name": "p"}, "spec": POD_SPEC})
    assert targets(refs) == POD_TARGETS | {("persistentvolumeclaims", "p-f"), ("nodes", "node-1")}
    assert (vx("nodes", "node-1"), "r") in refs  # cluster-scoped destination: no namespace
    # the same ConfigMap referenced twice (volume and envFrom) is one arc
    assert sum(1 for (v, _) in refs if v.name == "cm-vol") == 1


@pytest.mark.parametrize(
    ("resource", "wrap"),
    [
        ("deployments", lambda spec: {"spec": {"template": {"spec": spec}}}),
        ("replicasets", lambda spec: {"spec": {"template": {"spec": spec}}}),
        ("statefulsets", lambda spec: {"spec": {"template": {"spec": spec}, "serviceName": "headless"}}),
        ("jobs", lambda spec: {"spec": {"template": {"spec": spec}}}),
        ("cronjobs", lambda spec: {"spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}),
    ],
)
def test_pod_template_references(resource: str, wrap: Any) -> None:
    refs = refs_of(resource, wrap(POD_SPEC))
    expected = POD_TARGETS | {("nodes", "node-1")}
    if resource == "statefulsets":
        expected |= {("services", "headless")}
    assert targets(refs) == expected


def test_default_service_account() -> None:
    assert targets(refs_of("deployments", {"spec": {"template": {"spec": {"containers": []}}}})) == {
        ("serviceaccounts", "default")
    }


def test_owner_references() -> None:
    refs = refs_of(
        "pods",
        {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "rs",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    },
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner-cm"},
                    {"apiVersion": "example.com/v1", "kind": "Unwatched", "name": "x"},
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "controller": False, "blockOwnerDeletion": True},
                ]
            },
            "spec": {"serviceAccountName": "sa"},
        },
    )
    assert refs[(vx("replicasets", "rs"), "or")] == ATTR_CONTROLLER | ATTR_BLOCK_OWNER_DELETION
    assert refs[(vx("configmaps", "owner-cm"), "or")] == 0
    assert refs[(vx("nodes", "n1"), "or")] == ATTR_BLOCK_OWNER_DELETION
    assert len([k for k in refs if k[1] == "or"]) == 3  # no arc to resources that are not watched


def test_unwatched_destinations_produce_no_arcs() -> None:
    only_pods = selection("resource in ['pods', 'configmaps']")
    refs = refs_of("pods", {"spec": POD_SPEC}, only_pods)
    assert {v.resource for v, _ in refs} == {"configmaps"}


def test_service_account_pvc_pv_ingress_bindings() -> None:
    assert targets(
        refs_of("serviceaccounts", {"secrets": [{"name": "tok"}], "imagePullSecrets": [{"name": "pull"}]})
    ) == {
        ("secrets", "tok"),
        ("secrets", "pull"),
    }
    assert targets(refs_of("persistentvolumeclaims", {"spec": {"volumeName": "pv1", "storageClassName": "fast"}})) == {
        ("persistentvolumes", "pv1"),
        ("storageclasses", "fast"),
    }
    pv = refs_of("persistentvolumes", {"spec": {"claimRef": {"namespace": "other", "name": "claim"}}})
    assert (vx("persistentvolumeclaims", "claim", "other"), "r") in pv
    ingress = refs_of(
        "ingresses",
        {
            "spec": {
                "ingressClassName": "nginx",
                "defaultBackend": {"service": {"name": "default-svc"}},
                "rules": [{"http": {"paths": [{"backend": {"service": {"name": "svc"}}}]}}],
                "tls": [{"secretName": "tls"}],
            }
        },
    )
    assert targets(ingress) == {
        ("services", "default-svc"),
        ("services", "svc"),
        ("secrets", "tls"),
        ("ingressclasses", "nginx"),
    }
    binding = refs_of(
        "rolebindings",
        {
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "other"}, {"kind": "User", "name": "u"}],
        },
    )
    assert set(binding) == {(vx("clusterroles", "view"), "r"), (vx("serviceaccounts", "sa", "other"), "r")}
    assert targets(refs_of("rolebindings", {"roleRef": {"kind": "Role", "name": "r"}})) == {("roles", "r")}
    hpa = refs_of(
        "horizontalpodautoscalers",
        {"spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}},
    )
    assert targets(hpa) == {("deployments", "web")}


def test_selector_arcs_and_targets() -> None:
    service = extract(
        SEL.by_resource("", "services"),
        {"metadata": {"namespace": "ns", "name": "s"}, "spec": {"selector": {"app": "web"}}},
        SEL,
    )  # type: ignore[arg-type]
    assert len(service.selectors) == 1 and service.selectors[0].arc_type == "t"
    assert service.selectors[0].selector.matches({"app": "web", "x": "y"})
    no_selector = extract(
        SEL.by_resource("", "services"), {"metadata": {"namespace": "ns", "name": "s"}, "spec": {}}, SEL
    )  # type: ignore[arg-type]
    assert not no_selector.selectors
    pdb = extract(
        SEL.by_resource("policy", "poddisruptionbudgets"),  # type: ignore[arg-type]
        {
            "metadata": {"namespace": "ns", "name": "p"},
            "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}},
        },
        SEL,
    )
    assert pdb.selectors[0].selector.matches({"a": ""})
    endpoints = refs_of(
        "endpoints",
        {
            "metadata": {"name": "svc"},
            "subsets": [{"addresses": [{"targetRef": {"kind": "Pod", "name": "p1", "namespace": "ns"}}]}],
        },
    )
    assert targets(endpoints) == {("services", "svc"), ("pods", "p1")}
    event = refs_of(
        "events", {"involvedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "namespace": "ns"}}
    )
    assert targets(event) == {("deployments", "web")}


def test_service_account_token_secret() -> None:
    refs = refs_of(
        "secrets",
        {
            "type": "kubernetes.io/service-account-token",
            "metadata": {"annotations": {"kubernetes.io/service-account.name": "sa"}},
        },
    )
    assert targets(refs) == {("serviceaccounts", "sa")}


def helm_secret(manifest: str, namespace: str = "apps") -> dict[str, Any]:
    release = {"name": "rel", "namespace": namespace, "manifest": manifest}
    inner = base64.b64encode(gzip.compress(json.dumps(release).encode()))
    return {"type": "helm.sh/release.v1", "data": {"release": base64.b64encode(inner).decode()}}


def test_helm_storage_secret_lists_release_objects() -> None:
    manifest = """
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
  namespace: elsewhere
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: reader
---
# empty document
"""
    refs = refs_of("secrets", helm_secret(manifest))
    assert set(refs) == {
        (vx("deployments", "web", "apps"), "t"),
        (vx("configmaps", "cfg", "elsewhere"), "t"),
        (vx("clusterroles", "reader"), "t"),
    }


def test_broken_helm_secret_is_an_extraction_error() -> None:
    with pytest.raises(ExtractionError):
        refs_of("secrets", {"type": "helm.sh/release.v1", "data": {"release": "not base64!"}})


def test_flux_references() -> None:
    kustomization = refs_of(
        "kustomizations",
        {
            "spec": {
                "sourceRef": {"kind": "GitRepository", "name": "repo"},
                "decryption": {"secretRef": {"name": "sops"}},
                "dependsOn": [{"name": "infra"}],
                "postBuild": {"substituteFrom": [{"kind": "ConfigMap", "name": "vars"}]},
            },
            "status": {
                "inventory": {
                    "entries": [
                        {"id": "ns_web_apps_Deployment", "v": "v1"},
                        {"id": "_reader_rbac.authorization.k8s.io_ClusterRole", "v": "v1"},
                        {"id": "other_cfg__ConfigMap", "v": "v1"},
                        {"id": "ns_x_unknown.io_Thing", "v": "v1"},
                        {"id": "malformed"},
                    ]
                }
            },
        },
    )
    assert targets(kustomization) == {
        ("gitrepositories", "repo"),
        ("secrets", "sops"),
        ("kustomizations", "infra"),
        ("configmaps", "vars"),
    }
    assert set(k for k in kustomization if k[1] == "t") == {
        (vx("deployments", "web"), "t"),
        (vx("clusterroles", "reader"), "t"),
        (vx("configmaps", "cfg", "other"), "t"),
    }
    release = refs_of(
        "helmreleases",
        {
            "metadata": {"name": "podinfo"},
            "spec": {
                "chart": {
                    "spec": {"sourceRef": {"kind": "HelmRepository", "name": "charts", "namespace": "flux-system"}}
                },
                "valuesFrom": [{"kind": "Secret", "name": "values"}],
            },
            "status": {"storageNamespace": "ns", "history": [{"name": "podinfo", "namespace": "ns", "version": 3}]},
        },
    )
    assert targets(release) == {("helmrepositories", "charts"), ("secrets", "values")}
    assert (vx("helmrepositories", "charts", "flux-system"), "r") in release
    assert (vx("secrets", "sh.helm.release.v1.podinfo.v3"), "t") in release
    oci = refs_of(
        "ocirepositories", {"spec": {"secretRef": {"name": "creds"}, "verify": {"secretRef": {"name": "cosign"}}}}
    )
    assert targets(oci) == {("secrets", "creds"), ("secrets", "cosign")}
    assert targets(
        refs_of(
            "alerts",
            {
                "spec": {
                    "providerRef": {"name": "slack"},
                    "eventSources": [
                        {"kind": "Kustomization", "name": "*"},
                        {"kind": "HelmRelease", "name": "podinfo"},
                    ],
                }
            },
        )
    ) == {
        ("providers", "slack"),
        ("helmreleases", "podinfo"),
    }


def test_odd_shapes_do_not_crash() -> None:
    for obj in (
        {"spec": "nonsense"},
        {"spec": {"volumes": "x", "containers": [1, None, {"env": "x"}]}},
        {"metadata": {"ownerReferences": [1, {"kind": 1}]}},
        {"spec": {"volumes": [{"configMap": {"name": 5}}]}},
    ):
        refs_of("pods", obj)
