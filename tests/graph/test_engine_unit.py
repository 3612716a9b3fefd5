"""Engine event processing without a cluster: warnings that a real cluster cannot easily provoke."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tether.kube.client import KubeClient
from tether.kube.discovery import ApiResource
from tether.kube.kubeconfig import KubeCredentials
from tether.modules.graph.engine import engine as engine_module
from tether.modules.graph.engine.engine import GraphEngine, _Informer
from tether.modules.graph.engine.model import SetVertex, VertexId
from tether.modules.graph.engine.request import parse_request
from tether.modules.graph.engine.selection import select_resources

V = frozenset({"list", "watch"})
RESOURCES = [
    ApiResource("", "v1", "secrets", "Secret", True, V),
    ApiResource("", "v1", "configmaps", "ConfigMap", True, V),
    ApiResource("apps", "v1", "deployments", "Deployment", True, V),
]


def make_engine(request: dict[str, Any]) -> GraphEngine:
    engine = GraphEngine(KubeClient(KubeCredentials(server="http://127.0.0.1:1")), parse_request(json.dumps(request)))
    engine.selection = select_resources(RESOURCES, engine.request.queries)
    return engine


def informer(engine: GraphEngine, group: str, resource: str) -> _Informer:
    watched = engine.selection.by_resource(group, resource)  # type: ignore[union-attr]
    stub = _Informer.__new__(_Informer)
    stub.engine, stub.watched, stub.namespace = engine, watched, "ns"  # type: ignore[assignment]
    return stub


def test_unexpected_exception_becomes_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine({"queries": [{"include": {"resource_selector_expression": "true"}}]})

    def broken(*_: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(engine_module, "extract", broken)
    inf = informer(engine, "", "configmaps")
    for _ in range(3):
        inf.on_upsert({"metadata": {"name": "cm", "namespace": "ns"}})
    assert [w.type for w in engine._warnings] == ["INTERNAL_ERROR"]  # deduplicated
    assert "bug" in engine._warnings[0].message


def test_corrupt_helm_release_secret() -> None:
    engine = make_engine({"queries": [{"include": {"resource_selector_expression": "true"}}]})
    informer(engine, "", "secrets").on_upsert(
        {
            "metadata": {"name": "sh.helm.release.v1.x.v1", "namespace": "ns"},
            "type": "helm.sh/release.v1",
            "data": {"release": "!!"},
        }
    )
    (warning,) = engine._warnings
    assert warning.type == "OBJECT_PROCESSING_FAILED"
    assert warning.attributes == {"g": "", "v": "v1", "r": "secrets", "ns": "ns", "n": "sh.helm.release.v1.x.v1"}
    assert len(engine.graph) == 1  # the object is still in the graph, without the unreadable arcs


def test_type_meta_added_and_secret_content_dropped() -> None:
    engine = make_engine(
        {
            "queries": [
                {
                    "include": {
                        "resource_selector_expression": "resource == 'secrets'",
                        "object": {"json_path": "{.data}"},
                    }
                },
                {
                    "include": {
                        "resource_selector_expression": "true",
                        "object": {"object_selector_expression": "obj.kind == 'Deployment'"},
                    }
                },
            ]
        }
    )
    informer(engine, "apps", "deployments").on_upsert(
        {"metadata": {"name": "d", "namespace": "ns", "managedFields": [{}]}}
    )
    informer(engine, "", "secrets").on_upsert({"metadata": {"name": "s", "namespace": "ns"}, "data": {"k": "c2VjcmV0"}})
    actions = engine.view.take()
    objects = {a.vertex.name: a for a in actions if isinstance(a, SetVertex)}
    deployment = json.loads(objects["d"].object or b"{}")
    assert deployment["kind"] == "Deployment" and deployment["apiVersion"] == "apps/v1"
    assert "managedFields" not in deployment["metadata"]
    assert objects["s"].object is None and objects["s"].json_path is None
    assert not engine._warnings


def test_object_filter_error_warns_once_and_excludes() -> None:
    engine = make_engine(
        {
            "queries": [
                {
                    "include": {
                        "resource_selector_expression": "true",
                        "object": {"object_selector_expression": "obj.data.x == '1'"},
                    }
                }
            ]
        }
    )
    inf = informer(engine, "", "configmaps")
    inf.on_upsert({"metadata": {"name": "a", "namespace": "ns"}})
    inf.on_upsert({"metadata": {"name": "b", "namespace": "ns"}})
    inf.on_upsert({"metadata": {"name": "c", "namespace": "ns"}, "data": {"x": "1"}})
    assert [w.type for w in engine._warnings] == ["OBJECT_PROCESSING_FAILED"]
    assert engine._warnings[0].attributes["n"] == "a"
    assert {VertexId(*v).name for v in engine.graph.nodes} == {"c"}


def test_projections_kept_for_roots_are_compressed_and_sent_as_json() -> None:
    engine = make_engine(
        {
            "queries": [{"include": {"resource_selector_expression": "resource == 'configmaps'"}}],
            "roots": {"object_selector_expressions": ["name == 'root'"], "ignore_arc_direction": ["or"]},
        }
    )
    cms = informer(engine, "", "configmaps")
    data = {"k": "v" * 2000}
    cms.on_upsert({"metadata": {"name": "child", "namespace": "ns"}, "data": data})
    assert engine.view.take() == []  # no root yet: nothing is visible
    (node,) = engine.graph.nodes.values()
    assert node.packed and node.object is not None and len(node.object) < 200  # kept, compressed
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "child"}
    cms.on_upsert({"metadata": {"name": "root", "namespace": "ns", "ownerReferences": [owner]}})
    sent = {a.vertex.name: a for a in engine.view.take() if isinstance(a, SetVertex)}
    assert json.loads(sent["child"].object or b"") == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "child", "namespace": "ns"},
        "data": data,
    }
