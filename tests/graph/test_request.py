"""Request validation (seed 002 "Client request"): field-naming errors, modes, and fuzzing of the parser."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.modules.graph.engine.request import (
    NamespaceMode,
    RequestError,
    compile_request,
    decode_request,
    encode_request,
    parse_request,
)
from tether.modules.graph.rpc.wire import request_from_proto, request_to_proto
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2

OK_QUERY = {"include": {"resource_selector_expression": "group == 'apps'"}}


def req(**fields: Any) -> str:
    body: dict[str, Any] = {"queries": [OK_QUERY]}
    body.update(fields)
    return json.dumps(body)


def test_seed_example_parses() -> None:
    parsed = parse_request(
        json.dumps(
            {
                "queries": [
                    {"exclude": {"resource_selector_expression": "group == 'apps' && resource == 'pods'"}},
                    {
                        "include": {
                            "resource_selector_expression": (
                                "group == 'apps' && version == 'v1' && resource == 'deployments'"
                            ),
                            "object": {
                                "label_selector": "app=my-app",
                                "field_selector": "",
                                "object_selector_expression": "obj.status.ready == 'true'",
                                "json_path": "",
                            },
                        }
                    },
                ],
                "namespaces": {
                    "names": ["my-ns"],
                    "label_selector": "app=my-app",
                    "field_selector": "",
                    "object_selector_expression": "",
                },
                "roots": {
                    "object_selector_expressions": [
                        "group == 'apps' && resource == 'deployments' && namespace == 'myns' && "
                        "name == 'my-deployment' && 'app' in labels"
                    ],
                    "ignore_arc_direction": ["or", "r", "t"],
                },
            }
        )
    )
    assert [q.include for q in parsed.queries] == [False, True]
    assert parsed.queries[1].object_filter.label_selector == "app=my-app"
    assert parsed.queries[1].object_filter.expression is not None
    # names together with label_selector, as the seed sends them: both filters apply (issue 27 item 8).
    assert parsed.namespaces.mode is NamespaceMode.LIST
    assert parsed.namespaces.names == ("my-ns",) and parsed.namespaces.label_selector == "app=my-app"
    assert parsed.roots.enabled and parsed.roots.undirected == frozenset({"or", "r", "t"})


@pytest.mark.parametrize(
    ("message", "field", "fragment"),
    [
        ("", "request", "invalid JSON"),
        ("{", "request", "invalid JSON"),
        ("[]", "request", "Expected `object`"),
        ("{}", "queries", "at least one"),
        ('{"queries": []}', "queries", "at least one"),
        ('{"queries": [{}]}', "queries[0]", "exactly one"),
        ('{"queries": [{"include": {}, "exclude": {}}]}', "queries[0]", "exactly one"),
        (
            '{"queries": [{"include": {"resource_selector_expression": ""}}]}',
            "queries[0].include.resource_selector_expression",
            "empty",
        ),
        (
            '{"queries": [{"include": {"resource_selector_expression": "group"}}]}',
            "queries[0].include.resource_selector_expression",
            "bool",
        ),
        (
            '{"queries": [{"exclude": {"resource_selector_expression": "group =="}}]}',
            "queries[0].exclude.resource_selector_expression",
            "Syntax error",
        ),
        (
            '{"queries": [{"include": {"resource_selector_expression": "obj.x == 1"}}]}',
            "queries[0].include.resource_selector_expression",
            "undeclared",
        ),
        (
            '{"queries": [{"include": {"resource_selector_expression": 1}}]}',
            "queries[0].include.resource_selector_expression",
            "Expected `str`",
        ),
        (
            '{"queries": [{"include": {"resource_selector_expression": "true", "foo": 1}}]}',
            "queries[0].include",
            "unknown field `foo`",
        ),
        ('{"bogus": 1, "queries": []}', "request", "unknown field `bogus`"),
    ],
)
def test_rejections_name_the_field(message: str, field: str, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(message)
    assert info.value.field == field
    assert fragment in info.value.reason
    assert str(info.value).startswith(field + ": ")


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"label_selector": "a in ()"}, "label_selector"),
        ({"field_selector": "nope"}, "field_selector"),
        ({"object_selector_expression": "name"}, "object_selector_expression"),
        ({"object_selector_expression": "namespaced"}, "object_selector_expression"),
        ({"json_path": "{.a"}, "json_path"),
        ({"other": ""}, ""),
    ],
)
def test_object_filter_rejections(obj: dict[str, str], field: str) -> None:
    message = json.dumps({"queries": [OK_QUERY, {"include": {"resource_selector_expression": "true", "object": obj}}]})
    with pytest.raises(RequestError) as info:
        parse_request(message)
    expected = "queries[1].include.object" + (f".{field}" if field else "")
    assert info.value.field == expected


def test_namespace_modes() -> None:
    assert parse_request(req()).namespaces.mode is NamespaceMode.CLUSTER
    assert parse_request(req(namespaces={})).namespaces.mode is NamespaceMode.CLUSTER
    listed = parse_request(req(namespaces={"names": ["a", "b", "a"], "object_selector_expression": "name != 'b'"}))
    assert listed.namespaces.mode is NamespaceMode.LIST and listed.namespaces.names == ("a", "b")
    assert listed.namespaces.expression is not None
    narrowed = parse_request(req(namespaces={"names": ["a"], "label_selector": "t=x", "field_selector": "a!=b"}))
    assert narrowed.namespaces.mode is NamespaceMode.LIST and narrowed.namespaces.names == ("a",)
    assert (narrowed.namespaces.label_selector, narrowed.namespaces.field_selector) == ("t=x", "a!=b")
    labelled = parse_request(req(namespaces={"label_selector": "team=x"})).namespaces
    assert labelled.mode is NamespaceMode.ALL and labelled.label_selector == "team=x"
    assert parse_request(req(namespaces={"field_selector": "metadata.name!=x"})).namespaces.mode is NamespaceMode.ALL
    glab_default = parse_request(req(namespaces={"object_selector_expression": "name != 'kube-system'"})).namespaces
    assert glab_default.mode is NamespaceMode.ALL


@pytest.mark.parametrize(
    ("namespaces", "field"),
    [
        ({"names": ["Bad"]}, "namespaces.names[0]"),
        ({"names": ["ok", "x" * 64]}, "namespaces.names[1]"),
        ({"names": ["a"], "label_selector": "="}, "namespaces.label_selector"),
        ({"names": ["a"], "field_selector": "x"}, "namespaces.field_selector"),
        ({"label_selector": "="}, "namespaces.label_selector"),
        ({"field_selector": "x"}, "namespaces.field_selector"),
        ({"object_selector_expression": "obj"}, "namespaces.object_selector_expression"),
        ({"names": "a"}, "namespaces.names"),
    ],
)
def test_namespace_rejections(namespaces: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(req(namespaces=namespaces))
    assert info.value.field == field


def test_roots() -> None:
    assert not parse_request(req()).roots.enabled
    assert not parse_request(req(roots={})).roots.enabled
    assert not parse_request(req(roots={"object_selector_expressions": []})).roots.enabled
    with pytest.raises(RequestError) as info:
        parse_request(req(roots={"object_selector_expressions": ["true", "labels"]}))
    assert info.value.field == "roots.object_selector_expressions[1]"
    with pytest.raises(RequestError) as info:
        parse_request(req(roots={"object_selector_expressions": ["true"], "ignore_arc_direction": ["or", "x"]}))
    assert info.value.field == "roots.ignore_arc_direction[1]"


def test_size_limit() -> None:
    with pytest.raises(RequestError) as info:
        parse_request(" " * (2 << 20))
    assert info.value.field == "request"


def test_protobuf_round_trip() -> None:
    message = json.dumps(
        {
            "queries": [
                {"exclude": {"resource_selector_expression": "group == 'x'"}},
                {"include": {"resource_selector_expression": "true"}},
                {"include": {"resource_selector_expression": "true", "object": {"json_path": "{.a}"}}},
            ],
            "namespaces": {"names": ["a"], "object_selector_expression": "true"},
            "roots": {"object_selector_expressions": ["true"], "ignore_arc_direction": ["t"]},
        }
    )
    decoded = decode_request(message)
    pb = rpc_pb2.WatchGraphRequest.FromString(request_to_proto(decoded).SerializeToString())
    assert request_from_proto(pb) == decoded
    assert json.loads(encode_request(decoded)) == json.loads(message)
    # A query with neither variant (possible in protobuf) is rejected by agentk's validation too.
    pb.queries.add()
    with pytest.raises(RequestError) as info:
        compile_request(request_from_proto(pb))
    assert info.value.field == "queries[3]"


# ---- fuzzing ------------------------------------------------------------------------------------------

_cel_fragments = st.sampled_from(
    [
        "group",
        "version",
        "resource",
        "namespaced",
        "obj",
        "name",
        "labels",
        "==",
        "&&",
        "||",
        "!",
        "'apps'",
        "true",
        "(",
        ")",
        "[",
        "]",
        ".",
        "in",
        "1",
        "size(",
        "has(",
        "obj.a",
        "\x00",
        "'",
        '"',
        " ",
        "\\",
        "?",
        ":",
    ]
)
_cel = st.lists(_cel_fragments, max_size=8).map("".join) | st.text(max_size=30)
_selector = st.text(alphabet="abc=!,() in/.-_xyz\\", max_size=20) | st.text(max_size=10)
_jsonpath = st.text(alphabet="{}[]().*@$'\"?<>=!,:-0123abcrangeend \\", max_size=25)
_object = st.fixed_dictionaries(
    {},
    optional={
        "label_selector": _selector,
        "field_selector": _selector,
        "object_selector_expression": _cel,
        "json_path": _jsonpath,
        "unknown": st.integers(),
    },
)
_query = st.one_of(
    st.fixed_dictionaries(
        {"include": st.fixed_dictionaries({"resource_selector_expression": _cel}, optional={"object": _object})}
    ),
    st.fixed_dictionaries({"exclude": st.fixed_dictionaries({"resource_selector_expression": _cel})}),
    st.dictionaries(
        st.sampled_from(["include", "exclude", "other"]), st.none() | st.integers() | st.just({}), max_size=2
    ),
)
_request = st.fixed_dictionaries(
    {},
    optional={
        "queries": st.lists(_query, max_size=3) | st.integers(),
        "namespaces": st.fixed_dictionaries(
            {},
            optional={
                "names": st.lists(st.text(max_size=8), max_size=3),
                "label_selector": _selector,
                "field_selector": _selector,
                "object_selector_expression": _cel,
            },
        ),
        "roots": st.fixed_dictionaries(
            {},
            optional={
                "object_selector_expressions": st.lists(_cel, max_size=2),
                "ignore_arc_direction": st.lists(st.sampled_from(["or", "r", "t", "x", ""]), max_size=3),
            },
        ),
        "extra": st.none(),
    },
)


def _check(message: str | bytes) -> None:
    try:
        parsed = parse_request(message)
    except RequestError as exc:
        assert exc.field and exc.reason, "every rejection names a field and a reason"
        return
    # Accepted requests survive the trip to the agent and validate there too.
    compile_request(
        request_from_proto(rpc_pb2.WatchGraphRequest.FromString(request_to_proto(parsed.source).SerializeToString()))
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_request)
def test_fuzz_structured_requests(request: dict[str, Any]) -> None:
    _check(json.dumps(request))


@settings(max_examples=300)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_fuzz_arbitrary_bytes(message: str | bytes) -> None:
    _check(message)


@settings(max_examples=200)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["queries", "include", "exclude", "object", "namespaces", "roots", "names", "x"]),
                inner,
                max_size=3,
            )
        ),
        max_leaves=12,
    )
)
def test_fuzz_json_shapes(value: Any) -> None:
    _check(json.dumps(value))
