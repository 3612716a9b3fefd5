"""kubectl JSONPath: the engine's output against the real kubectl binary, results for ``j``, and a fuzz."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.k8s import cluster_assets
from tether.kube.jsonpath import JsonPathError, parse_jsonpath

OBJECT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "demo", "labels": {"app.kubernetes.io/name": "web", "tier": "a"}},
    "data": {"a": "1", "b": "2"},
    "xs": [{"n": 1, "s": "a"}, {"n": 2, "s": "b"}, {"n": 3}],
    "f": 1.5,
    "big": 100000000000,
    "t": True,
    "z": None,
    "e": [],
    "m": {},
    "nested": {"name": "inner", "deep": [{"name": "d1"}]},
}

TEMPLATES = [
    "{.metadata.name}",
    "{.metadata.labels['app.kubernetes.io/name']}",
    r"{.metadata.labels.app\.kubernetes\.io/name}",
    "{.data['a','b']}",
    "{.data.*}",
    "{..name}",
    "{.metadata}",
    "{.nope}",
    '{.metadata.labels}{"\\n"}',
    "{$.kind}",
    "{.metadata.name} {.kind}",
    "{.metadata['name','namespace']}",
    "{.xs[*].n}",
    '{range .xs[*]}{.n}{","}{end}',
    "{.xs[?(@.n>1)].n}",
    "{.xs[?(@.n==2)].s}",
    '{.xs[?(@.s=="b")].n}',
    "{.xs[?(@.s=='b')].n}",
    '{.xs[?(@.s!="a")].n}',
    "{.xs[?(@.n<=2)].n}",
    "{.xs[?(@.n>=2)].n}",
    "{.xs[?(@.s)].s}",
    "{.xs[-1:]}",
    "{.xs[-1].n}",
    "{.xs[::2].n}",
    "{.xs[1:]}",
    "{.xs[:2].n}",
    "{.xs[-2:-1].n}",
    "{.xs[0:0]}",
    "{.xs[0,2].n}",
    "{.f}",
    "{.big}",
    "{.t}",
    "{.z}",
    "{.xs}",
    "{..n}",
    "{.e}",
    "{.m}",
    "{.xs[*]}",
    "{@}",
    "{.xs[0].n}{.xs[1].n}",
    "{range .xs[*]}{range .*}<{@}>{end};{end}",
    "{.nested.deep[0]}",
    "x{.kind}y",
]


MAP_WILDCARDS = {"{.data.*}", "{..name}", "{range .xs[*]}{range .*}<{@}>{end};{end}"}


def _kubectl_render(kubectl: Path, source: Path, template: str) -> str:
    # `label --local` prints the object without contacting a server; it adds the label x=y.
    result = subprocess.run(
        [str(kubectl), "label", "--local", "-f", str(source), "x=y", "-o", f"jsonpath={template}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_render_matches_kubectl(tmp_path: Path) -> None:
    kubectl = cluster_assets()["kubectl"]
    source = tmp_path / "object.json"
    source.write_text(json.dumps(OBJECT))
    labelled = json.loads(json.dumps(OBJECT))
    labelled["metadata"]["labels"]["x"] = "y"
    mismatches = []
    for template in TEMPLATES:
        if template in MAP_WILDCARDS:
            continue  # Go iterates maps in random order: kubectl's output order varies between runs
        expected = _kubectl_render(kubectl, source, template)
        actual = parse_jsonpath(template).render(labelled)
        if expected != actual:
            mismatches.append((template, expected, actual))
    assert not mismatches


def test_find_returns_values_for_j() -> None:
    assert parse_jsonpath("{.metadata.name}").find(OBJECT) == ["demo"]
    assert parse_jsonpath("{.xs[*].n}").find(OBJECT) == [1, 2, 3]
    assert parse_jsonpath("{.metadata.labels}").find(OBJECT) == [OBJECT["metadata"]["labels"]]
    assert parse_jsonpath('{.metadata.name}{"/"}{.kind}').find(OBJECT) == ["demo", "/", "ConfigMap"]
    assert parse_jsonpath("{range .xs[*]}{.s}{end}").find(OBJECT) == ["a", "b"]
    assert parse_jsonpath("{.nope}").find(OBJECT) == []
    assert parse_jsonpath("{.xs[7]}").find(OBJECT) == []  # out of range selects nothing (no error)
    assert parse_jsonpath("{.xs[1:9].n}").find(OBJECT) == [2, 3]
    assert parse_jsonpath("{.z}").find(OBJECT) == [None]


def test_map_wildcards_follow_json_order() -> None:
    assert parse_jsonpath("{.data.*}").render(OBJECT) == "1 2"
    assert parse_jsonpath("{range .xs[*]}{range .*}<{@}>{end};{end}").render(OBJECT) == "<1><a>;<2><b>;<3>;"


def test_brace_less_path_is_relaxed() -> None:
    assert parse_jsonpath(".metadata.name").find(OBJECT) == ["demo"]
    assert parse_jsonpath("$.kind").find(OBJECT) == ["ConfigMap"]
    assert parse_jsonpath("plain text").find(OBJECT) == ["plain text"]


@pytest.mark.parametrize(
    "template",
    [
        "{.a",
        "{.xs[" + "1" * 50 + "]}",
        "{" + "9" * 5000 + "}",
        "{.xs[?(@.n>²)]}",
        "{range .xs[*]}{.n}",
        "{end}",
        "{.xs[}",
        "{.xs[a]}",
        "{.xs[?(@.n>1]}",
        "{foo}",
        "{.xs[::0]}",
        "{#}",
        "{'x}",
    ],
)
def test_parse_errors(template: str) -> None:
    with pytest.raises(JsonPathError) as info:
        parse_jsonpath(template)
    assert str(info.value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(st.text(max_size=40), _json)
def test_parser_and_evaluator_never_crash(template: str, data: Any) -> None:
    try:
        path = parse_jsonpath(template)
    except JsonPathError as exc:
        assert str(exc)
        return
    assert isinstance(path.find(data), list)
    assert isinstance(path.render(data), str)


@given(st.sampled_from(TEMPLATES), _json)
def test_known_templates_on_any_data(template: str, data: Any) -> None:
    path = parse_jsonpath(template)
    path.find(data)
    path.render(data)
