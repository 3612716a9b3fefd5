"""Resource selection (seed 002 "queries" and "version selection") and the CEL adapter."""

from __future__ import annotations

import json

import pytest

from tether.kube.discovery import ApiResource
from tether.modules.graph.engine.cel import (
    CelCompileError,
    CelEvaluationError,
    compile_object_expression,
    object_variables,
)
from tether.modules.graph.engine.request import parse_request
from tether.modules.graph.engine.selection import is_stable, natural_key, select_resources, select_version

VERBS = frozenset({"get", "list", "watch"})


def api(
    group: str, version: str, resource: str, *, namespaced: bool = True, kind: str = "", verbs=VERBS
) -> ApiResource:
    return ApiResource(group, version, resource, kind or resource.title(), namespaced, verbs)


def selected(resources: list[ApiResource], *queries: dict) -> set[tuple[str, str, str]]:
    request = parse_request(json.dumps({"queries": list(queries)}))
    return {(w.group, w.version, w.resource) for w in select_resources(resources, request.queries).resources}


def inc(expression: str) -> dict:
    return {"include": {"resource_selector_expression": expression}}


def exc(expression: str) -> dict:
    return {"exclude": {"resource_selector_expression": expression}}


def test_natural_order_and_stability() -> None:
    assert is_stable("v1") and is_stable("v10") and not is_stable("v1beta1") and not is_stable("V1")
    assert sorted(["v10", "v2", "v1"], key=natural_key) == ["v1", "v2", "v10"]
    assert sorted(["v1beta2", "v1alpha1", "v10beta1", "v2alpha1", "v1beta1"], key=natural_key) == [
        "v1alpha1",
        "v1beta1",
        "v1beta2",
        "v2alpha1",
        "v10beta1",
    ]


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (["v1"], "v1"),
        (["v1", "v2"], "v2"),
        (["v2", "v10"], "v10"),
        (["v1beta1", "v1"], "v1"),
        (["v2beta1", "v1"], "v1"),  # stable wins over newer unstable
        (["v1alpha1", "v1beta1"], "v1beta1"),
        (["v1beta1", "v2alpha1"], "v2alpha1"),
        (["v1beta2", "v1beta10"], "v1beta10"),
        ([], None),
    ],
)
def test_select_version(versions: list[str], expected: str | None) -> None:
    assert select_version(versions) == expected


def test_first_matching_query_wins() -> None:
    resources = [api("apps", "v1", "deployments"), api("", "v1", "pods"), api("", "v1", "configmaps")]
    # exclude first: pods never included even though the include below matches everything
    assert selected(resources, exc("resource == 'pods'"), inc("true")) == {
        ("apps", "v1", "deployments"),
        ("", "v1", "configmaps"),
    }
    # include first: the later exclude does not apply
    assert selected(resources, inc("resource == 'pods'"), exc("true"), inc("true")) == {("", "v1", "pods")}
    # nothing matches: nothing selected
    assert selected(resources, inc("group == 'nope'")) == set()


def test_object_filter_comes_from_the_including_query() -> None:
    request = parse_request(
        json.dumps(
            {
                "queries": [
                    {
                        "include": {
                            "resource_selector_expression": "resource == 'pods'",
                            "object": {"label_selector": "a=b"},
                        }
                    },
                    {"include": {"resource_selector_expression": "true", "object": {"json_path": "{.kind}"}}},
                ]
            }
        )
    )
    selection = select_resources([api("", "v1", "pods"), api("", "v1", "configmaps")], request.queries)
    pods = selection.by_resource("", "pods")
    configmaps = selection.by_resource("", "configmaps")
    assert pods is not None and pods.object_filter.label_selector == "a=b" and pods.query_index == 0
    assert configmaps is not None and configmaps.object_filter.json_path is not None


def test_version_selection_among_included_versions() -> None:
    resources = [
        api("example.com", "v1alpha1", "widgets"),
        api("example.com", "v1", "widgets"),
        api("example.com", "v2beta1", "widgets"),
        api("example.com", "v1beta1", "gadgets"),
        api("example.com", "v1beta2", "gadgets"),
    ]
    assert selected(resources, inc("true")) == {("example.com", "v1", "widgets"), ("example.com", "v1beta2", "gadgets")}
    # excluding the stable version leaves the newest unstable one
    assert selected(resources, exc("version == 'v1'"), inc("true")) == {
        ("example.com", "v2beta1", "widgets"),
        ("example.com", "v1beta2", "gadgets"),
    }


def test_cohabitation_groups_and_unwatchable_resources_are_excluded() -> None:
    resources = [
        api("extensions", "v1beta1", "ingresses"),
        api("events.k8s.io", "v1", "events"),
        api("", "v1", "events"),
        api("", "v1", "bindings", verbs=frozenset({"create"})),
        api("authorization.k8s.io", "v1", "selfsubjectaccessreviews", namespaced=False, verbs=frozenset({"create"})),
        api("", "v1", "pods/log"),
    ]
    assert selected(resources, inc("true")) == {("", "v1", "events")}


def test_resource_expression_variables() -> None:
    resources = [api("", "v1", "namespaces", namespaced=False), api("", "v1", "pods")]
    assert selected(resources, inc("!namespaced")) == {("", "v1", "namespaces")}
    assert selected(resources, inc("namespaced && version == 'v1' && group == ''")) == {("", "v1", "pods")}


def test_kind_resolution() -> None:
    request = parse_request(json.dumps({"queries": [inc("true")]}))
    selection = select_resources(
        [api("apps", "v1", "deployments", kind="Deployment"), api("apps", "v1beta2", "deployments", kind="Deployment")],
        request.queries,
    )
    watched = selection.by_api_version_kind("apps/v1beta2", "Deployment")
    assert watched is not None and watched.version == "v1"  # owner references in any version resolve to the watched one
    assert selection.by_kind("", "Deployment") is None


def test_cel_namespace_variable_and_errors() -> None:
    program = compile_object_expression("namespace == 'a' && obj.metadata.namespace == namespace && 'x' in labels")
    variables = object_variables({"metadata": {"namespace": "a", "labels": {"x": "1"}}}, "", "v1", "pods", "a", "p")
    assert program.evaluate(variables) is True
    assert compile_object_expression("'namespace' == name").evaluate(variables) is False
    with pytest.raises(CelEvaluationError):
        compile_object_expression("obj.spec.replicas > 1").evaluate(variables)
    with pytest.raises(CelCompileError) as info:
        compile_object_expression("namespace + 1 == 2")
    assert "namespace" in str(info.value) and "_ns_alias" not in str(info.value)
    with pytest.raises(CelCompileError):
        compile_object_expression("obj.spec.paused")  # dyn, not bool
    assert compile_object_expression("obj.?spec.paused.orValue(false) == false").evaluate(variables) is True
    assert compile_object_expression("name.startsWith('p') && name.lowerAscii() == 'p'").evaluate(variables)
