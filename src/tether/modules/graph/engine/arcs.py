"""Arc extraction: the references one object holds (seed 002 "Types of arcs", issue 6 item 5).

:func:`extract` reads one object and returns its outgoing arcs as ``(destination, type) -> attributes``
plus the label selectors it uses to select other objects. Destinations are resolved against the watched
resources only ("Arcs are not emitted for GVRs that are not being watched") and always use the watched
version of the destination's group+resource. The full table is in ``docs/graph.md``; in short:

- ``or``: every ``metadata.ownerReferences[]`` entry (``c`` controller, ``b`` blockOwnerDeletion).
- ``r``: a field of the source names the destination: Pod and pod-template volumes, ``env`` /
  ``envFrom``, image pull secrets, service account, node, priority/runtime class; PVC <-> PV, storage
  class; Ingress backends/TLS/class; (Cluster)RoleBinding role and ServiceAccount subjects; HPA target;
  Endpoints/EndpointSlice targets; webhook and APIService services; Event involved objects; Flux
  source/secret/dependency references.
- ``t``: the relation is derived rather than named: Service / PodDisruptionBudget / NetworkPolicy label
  selectors to Pods, Flux ``Kustomization`` inventory entries, Flux ``HelmRelease`` to its Helm storage
  Secret, and a Helm storage Secret to every object of the release manifest.

Workload selectors (Deployment, ReplicaSet, StatefulSet, DaemonSet, Job) are not turned into arcs:
their controllers resolve overlapping selectors through controller owner references, so the dependent's
``or`` arc with ``c`` is the resolved relation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tether.kube.selectors import LabelSelector, SelectorError, label_selector_from_object
from tether.modules.graph.engine.helm import HELM_RELEASE_SECRET_TYPE, HelmReleaseError, release_objects
from tether.modules.graph.engine.model import (
    ARC_OWNER,
    ARC_REFERENCE,
    ARC_TRANSITIVE,
    ATTR_BLOCK_OWNER_DELETION,
    ATTR_CONTROLLER,
    SelectorRef,
    VertexId,
)
from tether.modules.graph.engine.selection import Selection, WatchedResource

__all__ = ["Extracted", "ExtractionError", "extract"]

_CORE = ""
_APPS = "apps"
_BATCH = "batch"
_RBAC = "rbac.authorization.k8s.io"
_NETWORKING = "networking.k8s.io"
_FLUX_SOURCE = "source.toolkit.fluxcd.io"
_FLUX_KUSTOMIZE = "kustomize.toolkit.fluxcd.io"
_FLUX_HELM = "helm.toolkit.fluxcd.io"
_FLUX_NOTIFICATION = "notification.toolkit.fluxcd.io"


class ExtractionError(ValueError):
    """Part of the object could not be interpreted (arcs found so far are still returned in ``partial``)."""

    def __init__(self, message: str, partial: Extracted) -> None:
        super().__init__(message)
        self.partial = partial


class Extracted:
    """Outgoing references of one object.

    Attributes:
        refs: ``(destination, arc type) -> attribute bits`` (duplicates merged, attributes OR-ed).
        selectors: label selectors selecting destinations.
    """

    __slots__ = ("refs", "selectors")

    def __init__(self) -> None:
        self.refs: dict[tuple[VertexId, str], int] = {}
        self.selectors: list[SelectorRef] = []


class _Builder:
    def __init__(self, selection: Selection, namespace: str) -> None:
        self.selection = selection
        self.namespace = namespace
        self.out = Extracted()

    def add(self, watched: WatchedResource | None, namespace: str, name: Any, arc_type: str, attrs: int = 0) -> None:
        if watched is None or not isinstance(name, str) or not name:
            return
        vertex = VertexId(
            watched.group, watched.version, watched.resource, (namespace or "") if watched.namespaced else "", name
        )
        if watched.namespaced and not vertex.namespace:
            return
        key = (vertex, arc_type)
        self.out.refs[key] = self.out.refs.get(key, 0) | attrs

    def ref(
        self, group: str, resource: str, name: Any, arc_type: str = ARC_REFERENCE, namespace: str | None = None
    ) -> None:
        if not name or not isinstance(name, str):
            return
        self.add(
            self.selection.by_resource(group, resource),
            self.namespace if namespace is None else namespace,
            name,
            arc_type,
        )

    def ref_kind(self, group: str, kind: Any, name: Any, arc_type: str = ARC_REFERENCE, namespace: Any = None) -> None:
        if not isinstance(kind, str):
            return
        ns = namespace if isinstance(namespace, str) and namespace else self.namespace
        self.add(self.selection.by_kind(group, kind), ns, name, arc_type)

    def ref_api_version_kind(
        self, api_version: Any, kind: Any, name: Any, arc_type: str = ARC_REFERENCE, namespace: Any = None
    ) -> None:
        if not isinstance(kind, str):
            return
        group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
        self.ref_kind(group, kind, name, arc_type, namespace)

    def select(self, group: str, resource: str, selector: LabelSelector, arc_type: str = ARC_TRANSITIVE) -> None:
        watched = self.selection.by_resource(group, resource)
        if watched is None or selector.nothing or not self.namespace:
            return
        self.out.selectors.append(
            SelectorRef(watched.group, watched.version, watched.resource, self.namespace, selector, arc_type)
        )


def extract(watched: WatchedResource, obj: Mapping[str, Any], selection: Selection) -> Extracted:
    """Outgoing arcs of ``obj``, an object of ``watched``.

    Args:
        watched: the object's resource.
        obj: the object as decoded JSON.
        selection: the watched resources (destinations must be among them).

    Raises:
        ExtractionError: a field had an unexpected shape (the arcs found before are in ``partial``).
    """
    meta = _map(obj.get("metadata"))
    namespace = str(meta.get("namespace") or "") if watched.namespaced else ""
    builder = _Builder(selection, namespace)
    try:
        for owner_ref in _list(meta.get("ownerReferences")):
            owner = _map(owner_ref)
            attrs = (ATTR_CONTROLLER if owner.get("controller") is True else 0) | (
                ATTR_BLOCK_OWNER_DELETION if owner.get("blockOwnerDeletion") is True else 0
            )
            api_version, kind = owner.get("apiVersion"), owner.get("kind")
            if isinstance(api_version, str) and isinstance(kind, str):
                builder.add(
                    selection.by_api_version_kind(api_version, kind), namespace, owner.get("name"), ARC_OWNER, attrs
                )
        handler = _HANDLERS.get((watched.group, watched.resource))
        if handler is not None:
            handler(builder, obj)
    except (TypeError, AttributeError, ValueError, SelectorError, HelmReleaseError) as exc:
        raise ExtractionError(f"{type(exc).__name__}: {exc}", builder.out) from exc
    return builder.out


# ---- helpers -----------------------------------------------------------------------------------------


_NO_FIELDS: Mapping[str, Any] = {}


def _map(value: Any) -> Mapping[str, Any]:
    # Decoded JSON objects are dicts: a concrete isinstance check is much cheaper than the Mapping ABC.
    return value if isinstance(value, dict) else _NO_FIELDS


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


# ---- Pods and pod templates ---------------------------------------------------------------------------

#: Volume source -> (resource, path to the name) of the object it names. Looked up per key a volume has
#: (its name and usually one source) instead of trying every source on every volume.
_VOLUME_REFS: dict[str, tuple[str, tuple[str, ...]]] = {
    "configMap": ("configmaps", ("name",)),
    "secret": ("secrets", ("secretName",)),
    "persistentVolumeClaim": ("persistentvolumeclaims", ("claimName",)),
    "csi": ("secrets", ("nodePublishSecretRef", "name")),
    "azureFile": ("secrets", ("secretName",)),
    **{
        p: ("secrets", ("secretRef", "name"))
        for p in ("cephfs", "rbd", "iscsi", "flexVolume", "scaleIO", "storageos", "cinder")
    },
}


def _pod_spec(b: _Builder, spec: Any, pod_name: str | None = None) -> None:
    """References of a PodSpec (Pods pass their name, for generic ephemeral volume claims)."""
    spec = _map(spec)
    for volume_item in _list(spec.get("volumes")):
        volume = _map(volume_item)
        for source_type, source in volume.items():
            named = _VOLUME_REFS.get(source_type)
            if named is not None:
                b.ref(_CORE, named[0], _get(source, *named[1]))
            elif source_type == "projected":
                for projection in _list(_get(source, "sources")):
                    b.ref(_CORE, "configmaps", _get(projection, "configMap", "name"))
                    b.ref(_CORE, "secrets", _get(projection, "secret", "name"))
            elif (
                source_type == "ephemeral"
                and pod_name
                and isinstance(source, dict)
                and isinstance(volume.get("name"), str)
            ):
                b.ref(_CORE, "persistentvolumeclaims", f"{pod_name}-{volume['name']}")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for container_item in _list(spec.get(group)):
            container = _map(container_item)
            for env_from in _list(container.get("envFrom")):
                b.ref(_CORE, "configmaps", _get(env_from, "configMapRef", "name"))
                b.ref(_CORE, "secrets", _get(env_from, "secretRef", "name"))
            for env in _list(container.get("env")):
                b.ref(_CORE, "configmaps", _get(env, "valueFrom", "configMapKeyRef", "name"))
                b.ref(_CORE, "secrets", _get(env, "valueFrom", "secretKeyRef", "name"))
    for pull_secret in _list(spec.get("imagePullSecrets")):
        b.ref(_CORE, "secrets", _get(pull_secret, "name"))
    b.ref(_CORE, "serviceaccounts", spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
    b.ref(_CORE, "nodes", spec.get("nodeName"))
    b.ref("scheduling.k8s.io", "priorityclasses", spec.get("priorityClassName"))
    b.ref("node.k8s.io", "runtimeclasses", spec.get("runtimeClassName"))
    for claim in _list(spec.get("resourceClaims")):
        b.ref("resource.k8s.io", "resourceclaims", _get(claim, "resourceClaimName"))
        b.ref("resource.k8s.io", "resourceclaimtemplates", _get(claim, "resourceClaimTemplateName"))


def _pod(b: _Builder, obj: Mapping[str, Any]) -> None:
    _pod_spec(b, obj.get("spec"), str(_get(obj, "metadata", "name") or "") or None)


def _template(*path: str) -> Callable[[_Builder, Mapping[str, Any]], None]:
    def handler(b: _Builder, obj: Mapping[str, Any]) -> None:
        _pod_spec(b, _get(obj, *path))

    return handler


def _statefulset(b: _Builder, obj: Mapping[str, Any]) -> None:
    _pod_spec(b, _get(obj, "spec", "template", "spec"))
    b.ref(_CORE, "services", _get(obj, "spec", "serviceName"))


# ---- core and built-in API groups ---------------------------------------------------------------------


def _service_account(b: _Builder, obj: Mapping[str, Any]) -> None:
    for secret in _list(obj.get("secrets")):
        b.ref(_CORE, "secrets", _get(secret, "name"))
    for secret in _list(obj.get("imagePullSecrets")):
        b.ref(_CORE, "secrets", _get(secret, "name"))


def _secret(b: _Builder, obj: Mapping[str, Any]) -> None:
    if obj.get("type") == "kubernetes.io/service-account-token":
        b.ref(_CORE, "serviceaccounts", _get(obj, "metadata", "annotations", "kubernetes.io/service-account.name"))
    elif obj.get("type") == HELM_RELEASE_SECRET_TYPE:
        release_namespace, objects = release_objects(dict(obj))
        release_namespace = release_namespace or b.namespace
        for item in objects:
            b.ref_api_version_kind(
                item.api_version, item.kind, item.name, ARC_TRANSITIVE, item.namespace or release_namespace
            )


def _pvc(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    b.ref(_CORE, "persistentvolumes", spec.get("volumeName"), namespace="")
    b.ref("storage.k8s.io", "storageclasses", spec.get("storageClassName"))
    for source_item in (spec.get("dataSource"), spec.get("dataSourceRef")):
        source = _map(source_item)
        b.ref_kind(
            str(source.get("apiGroup") or ""), source.get("kind"), source.get("name"), namespace=source.get("namespace")
        )


def _pv(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    claim = _map(spec.get("claimRef"))
    if claim.get("kind", "PersistentVolumeClaim") == "PersistentVolumeClaim":
        b.ref(_CORE, "persistentvolumeclaims", claim.get("name"), namespace=str(claim.get("namespace") or ""))
    b.ref("storage.k8s.io", "storageclasses", spec.get("storageClassName"))
    csi = _map(spec.get("csi"))
    for key in (
        "controllerPublishSecretRef",
        "nodeStageSecretRef",
        "nodePublishSecretRef",
        "controllerExpandSecretRef",
        "nodeExpandSecretRef",
    ):
        ref = _map(csi.get(key))
        b.ref(_CORE, "secrets", ref.get("name"), namespace=str(ref.get("namespace") or ""))


def _service(b: _Builder, obj: Mapping[str, Any]) -> None:
    selector = _get(obj, "spec", "selector")
    if isinstance(selector, dict) and selector:
        b.select(_CORE, "pods", label_selector_from_object({"matchLabels": selector}))


def _selector_to_pods(*path: str) -> Callable[[_Builder, Mapping[str, Any]], None]:
    def handler(b: _Builder, obj: Mapping[str, Any]) -> None:
        b.select(_CORE, "pods", label_selector_from_object(_get(obj, *path)))

    return handler


def _endpoints(b: _Builder, obj: Mapping[str, Any]) -> None:
    b.ref(_CORE, "services", _get(obj, "metadata", "name"))
    for subset in _list(obj.get("subsets")):
        for key in ("addresses", "notReadyAddresses"):
            for address in _list(_get(subset, key)):
                _target_ref(b, _get(address, "targetRef"))


def _endpoint_slice(b: _Builder, obj: Mapping[str, Any]) -> None:
    b.ref(_CORE, "services", _get(obj, "metadata", "labels", "kubernetes.io/service-name"))
    for endpoint in _list(obj.get("endpoints")):
        _target_ref(b, _get(endpoint, "targetRef"))


def _target_ref(b: _Builder, ref: Any) -> None:
    ref = _map(ref)
    if ref:
        b.ref_api_version_kind(
            ref.get("apiVersion", "v1"), ref.get("kind"), ref.get("name"), namespace=ref.get("namespace")
        )


def _event(b: _Builder, obj: Mapping[str, Any]) -> None:
    for key in ("involvedObject", "related"):
        ref = _map(obj.get(key))
        if ref:
            b.ref_api_version_kind(
                ref.get("apiVersion"), ref.get("kind"), ref.get("name"), namespace=ref.get("namespace")
            )


def _ingress_backend(b: _Builder, backend: Any) -> None:
    backend = _map(backend)
    b.ref(_CORE, "services", _get(backend, "service", "name"))
    resource = _map(backend.get("resource"))
    if resource:
        b.ref_kind(str(resource.get("apiGroup") or ""), resource.get("kind"), resource.get("name"))


def _ingress(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    _ingress_backend(b, spec.get("defaultBackend"))
    for rule in _list(spec.get("rules")):
        for path in _list(_get(rule, "http", "paths")):
            _ingress_backend(b, _get(path, "backend"))
    for tls in _list(spec.get("tls")):
        b.ref(_CORE, "secrets", _get(tls, "secretName"))
    b.ref(_NETWORKING, "ingressclasses", spec.get("ingressClassName"))


def _ingress_class(b: _Builder, obj: Mapping[str, Any]) -> None:
    params = _map(_get(obj, "spec", "parameters"))
    if params:
        b.ref_kind(
            str(params.get("apiGroup") or ""), params.get("kind"), params.get("name"), namespace=params.get("namespace")
        )


def _binding(b: _Builder, obj: Mapping[str, Any]) -> None:
    role = _map(obj.get("roleRef"))
    if role.get("kind") == "Role":
        b.ref(_RBAC, "roles", role.get("name"))
    elif role.get("kind") == "ClusterRole":
        b.ref(_RBAC, "clusterroles", role.get("name"))
    for subject_item in _list(obj.get("subjects")):
        subject = _map(subject_item)
        if subject.get("kind") == "ServiceAccount":
            b.ref(_CORE, "serviceaccounts", subject.get("name"), namespace=str(subject.get("namespace") or b.namespace))


def _hpa(b: _Builder, obj: Mapping[str, Any]) -> None:
    target = _map(_get(obj, "spec", "scaleTargetRef"))
    b.ref_api_version_kind(target.get("apiVersion"), target.get("kind"), target.get("name"))


def _webhooks(b: _Builder, obj: Mapping[str, Any]) -> None:
    for webhook in _list(obj.get("webhooks")):
        service = _map(_get(webhook, "clientConfig", "service"))
        b.ref(_CORE, "services", service.get("name"), namespace=str(service.get("namespace") or ""))


def _api_service(b: _Builder, obj: Mapping[str, Any]) -> None:
    service = _map(_get(obj, "spec", "service"))
    b.ref(_CORE, "services", service.get("name"), namespace=str(service.get("namespace") or ""))


def _volume_attachment(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    b.ref(_CORE, "persistentvolumes", _get(spec, "source", "persistentVolumeName"))
    b.ref(_CORE, "nodes", spec.get("nodeName"))


def _policy_binding(b: _Builder, obj: Mapping[str, Any]) -> None:
    b.ref("admissionregistration.k8s.io", "validatingadmissionpolicies", _get(obj, "spec", "policyName"))


# ---- Flux ---------------------------------------------------------------------------------------------


def _flux_ref(b: _Builder, ref: Any, default_group: str, arc_type: str = ARC_REFERENCE) -> None:
    ref = _map(ref)
    if not ref:
        return
    api_version = ref.get("apiVersion")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) and api_version else default_group
    b.ref_kind(group, ref.get("kind"), ref.get("name"), arc_type, ref.get("namespace"))


def _secret_ref(b: _Builder, spec: Any, *path: str) -> None:
    b.ref(_CORE, "secrets", _get(spec, *path, "name"))


def _flux_source(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    for key in ("secretRef", "certSecretRef", "proxySecretRef"):
        _secret_ref(b, spec, key)
    _secret_ref(b, spec, "verify", "secretRef")
    b.ref(_CORE, "serviceaccounts", spec.get("serviceAccountName"))
    if "sourceRef" in spec:  # HelmChart
        _flux_ref(b, spec.get("sourceRef"), _FLUX_SOURCE)


def _kustomization(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    _flux_ref(b, spec.get("sourceRef"), _FLUX_SOURCE)
    _secret_ref(b, spec, "decryption", "secretRef")
    _secret_ref(b, spec, "kubeConfig", "secretRef")
    b.ref(_CORE, "serviceaccounts", spec.get("serviceAccountName"))
    for dependency in _list(spec.get("dependsOn")):
        b.ref(
            _FLUX_KUSTOMIZE,
            "kustomizations",
            _get(dependency, "name"),
            namespace=str(_get(dependency, "namespace") or b.namespace),
        )
    for source in _list(_get(spec, "postBuild", "substituteFrom")):
        _kind_ref(b, source)
    for entry in _list(_get(obj, "status", "inventory", "entries")):
        entry_id = _get(entry, "id")
        if not isinstance(entry_id, str):
            continue
        parts = entry_id.split("_")
        if len(parts) != 4:
            continue
        namespace, name, group, kind = parts
        b.ref_kind(group, kind, name, ARC_TRANSITIVE, namespace)


def _kind_ref(b: _Builder, ref: Any) -> None:
    kind = _get(ref, "kind")
    if kind == "ConfigMap":
        b.ref(_CORE, "configmaps", _get(ref, "name"))
    elif kind == "Secret":
        b.ref(_CORE, "secrets", _get(ref, "name"))


def _helm_release(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    _flux_ref(b, _get(spec, "chart", "spec", "sourceRef"), _FLUX_SOURCE)
    _flux_ref(b, spec.get("chartRef"), _FLUX_SOURCE)
    for source in _list(spec.get("valuesFrom")):
        _kind_ref(b, source)
    _secret_ref(b, spec, "kubeConfig", "secretRef")
    b.ref(_CORE, "serviceaccounts", spec.get("serviceAccountName"))
    for dependency in _list(spec.get("dependsOn")):
        b.ref(
            _FLUX_HELM,
            "helmreleases",
            _get(dependency, "name"),
            namespace=str(_get(dependency, "namespace") or b.namespace),
        )
    status = _map(obj.get("status"))
    storage_namespace = str(status.get("storageNamespace") or spec.get("storageNamespace") or b.namespace)
    history = _list(status.get("history"))
    if history:
        latest = _map(history[0])
        release, revision = latest.get("name"), latest.get("version")
    else:
        release = spec.get("releaseName") or (
            f"{spec['targetNamespace']}-{_get(obj, 'metadata', 'name')}"
            if spec.get("targetNamespace")
            else _get(obj, "metadata", "name")
        )
        revision = status.get("lastReleaseRevision")
    if isinstance(release, str) and release and isinstance(revision, int) and revision > 0:
        b.ref(_CORE, "secrets", f"sh.helm.release.v1.{release}.v{revision}", ARC_TRANSITIVE, storage_namespace)


def _receiver(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    _secret_ref(b, spec, "secretRef")
    for resource in _list(spec.get("resources")):
        if _get(resource, "name") != "*":
            _flux_ref(b, resource, _FLUX_SOURCE)


def _alert(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    b.ref(_FLUX_NOTIFICATION, "providers", _get(spec, "providerRef", "name"))
    for source in _list(spec.get("eventSources")):
        if _get(source, "name") != "*":
            kind = _get(source, "kind")
            group = (
                _FLUX_KUSTOMIZE if kind == "Kustomization" else _FLUX_HELM if kind == "HelmRelease" else _FLUX_SOURCE
            )
            _flux_ref(b, source, group)


def _provider(b: _Builder, obj: Mapping[str, Any]) -> None:
    spec = _map(obj.get("spec"))
    _secret_ref(b, spec, "secretRef")
    _secret_ref(b, spec, "certSecretRef")


_HANDLERS: dict[tuple[str, str], Callable[[_Builder, Mapping[str, Any]], None]] = {
    (_CORE, "pods"): _pod,
    (_CORE, "podtemplates"): _template("template", "spec"),
    (_CORE, "replicationcontrollers"): _template("spec", "template", "spec"),
    (_APPS, "deployments"): _template("spec", "template", "spec"),
    (_APPS, "replicasets"): _template("spec", "template", "spec"),
    (_APPS, "daemonsets"): _template("spec", "template", "spec"),
    (_APPS, "statefulsets"): _statefulset,
    (_BATCH, "jobs"): _template("spec", "template", "spec"),
    (_BATCH, "cronjobs"): _template("spec", "jobTemplate", "spec", "template", "spec"),
    (_CORE, "serviceaccounts"): _service_account,
    (_CORE, "secrets"): _secret,
    (_CORE, "persistentvolumeclaims"): _pvc,
    (_CORE, "persistentvolumes"): _pv,
    (_CORE, "services"): _service,
    (_CORE, "endpoints"): _endpoints,
    (_CORE, "events"): _event,
    ("discovery.k8s.io", "endpointslices"): _endpoint_slice,
    ("policy", "poddisruptionbudgets"): _selector_to_pods("spec", "selector"),
    (_NETWORKING, "networkpolicies"): _selector_to_pods("spec", "podSelector"),
    (_NETWORKING, "ingresses"): _ingress,
    (_NETWORKING, "ingressclasses"): _ingress_class,
    (_RBAC, "rolebindings"): _binding,
    (_RBAC, "clusterrolebindings"): _binding,
    ("autoscaling", "horizontalpodautoscalers"): _hpa,
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): _webhooks,
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): _webhooks,
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): _policy_binding,
    ("apiregistration.k8s.io", "apiservices"): _api_service,
    ("storage.k8s.io", "volumeattachments"): _volume_attachment,
    (_FLUX_SOURCE, "gitrepositories"): _flux_source,
    (_FLUX_SOURCE, "ocirepositories"): _flux_source,
    (_FLUX_SOURCE, "helmrepositories"): _flux_source,
    (_FLUX_SOURCE, "buckets"): _flux_source,
    (_FLUX_SOURCE, "helmcharts"): _flux_source,
    (_FLUX_KUSTOMIZE, "kustomizations"): _kustomization,
    (_FLUX_HELM, "helmreleases"): _helm_release,
    (_FLUX_NOTIFICATION, "receivers"): _receiver,
    (_FLUX_NOTIFICATION, "alerts"): _alert,
    (_FLUX_NOTIFICATION, "providers"): _provider,
}


def handled_resources() -> Iterable[tuple[str, str]]:
    """Group+resource pairs with built-in reference extraction (besides owner references)."""
    return _HANDLERS.keys()
