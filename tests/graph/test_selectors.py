"""Label and field selectors: grammar, validation, matching, and a fuzz for the parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.kube.selectors import (
    FieldSelector,
    LabelSelector,
    Operator,
    SelectorError,
    label_selector_from_object,
    parse_field_selector,
    parse_label_selector,
)


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", {}, True),
        ("   ", {"a": "b"}, True),
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "web"}, True),
        ("app=web", {"app": "db"}, False),
        ("app!=web", {}, True),
        ("app!=web", {"app": "web"}, False),
        ("app", {"app": ""}, True),
        ("app", {}, False),
        ("!app", {}, True),
        ("!app", {"app": "x"}, False),
        ("tier in (a, b)", {"tier": "b"}, True),
        ("tier in (a,b)", {"tier": "c"}, False),
        ("tier notin (a,b)", {}, True),
        ("tier notin (a,b)", {"tier": "a"}, False),
        ("x>3", {"x": "4"}, True),
        ("x > 3", {"x": "3"}, False),
        ("x<3", {"x": "-1"}, True),
        ("x<3", {"x": "abc"}, False),
        ("a=1, b in (2), !c", {"a": "1", "b": "2"}, True),
        ("example.com/app=web", {"example.com/app": "web"}, True),
        ("a=", {"a": ""}, True),
        ("a in (x,)", {"a": ""}, True),
        # "in" and "notin" are operators only where an operator goes; as keys and values they are words
        # (apimachinery's parser reads keys and values in its Values context). Found by the property below.
        ("a=in", {"a": "in"}, True),
        ("a!=notin", {"a": "notin"}, False),
        ("in=notin", {"in": "notin"}, True),
        ("in", {"in": ""}, True),
        ("!notin", {"notin": "x"}, False),
        ("in in (in, notin)", {"in": "notin"}, True),
        ("notin notin (in)", {"notin": "in"}, False),
    ],
)
def test_label_selector_matching(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(text).matches(labels) is expected


@pytest.mark.parametrize(
    "text",
    [
        "a in ()",
        "a in (x",
        "a=b=c",
        "a,",
        ",a",
        "!",
        "a > x",
        "a b",
        "-a=b",
        "a=-b",
        "x" * 64 + "=v",
        "a=" + "v" * 64,
        "Bad_Prefix/a=b",
        "/a=b",
        "a/=b",
        "a in x",
        "a notin (b c)",
    ],
)
def test_label_selector_rejections_have_reasons(text: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector(text)
    assert str(info.value)


def test_label_selector_structure() -> None:
    selector = parse_label_selector("a in (x, y), !b")
    assert selector.requirements[0].operator is Operator.IN
    assert selector.requirements[0].values == frozenset({"x", "y"})
    assert selector.requirements[1].operator is Operator.DOES_NOT_EXIST


def test_label_selector_from_object() -> None:
    assert label_selector_from_object(None).matches({"a": "b"}) is False
    assert label_selector_from_object({}).matches({"a": "b"}) is True
    selector = label_selector_from_object(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["fe", "be"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "Exists"},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
            ],
        }
    )
    assert selector.matches({"app": "web", "tier": "fe", "zone": "z"})
    assert not selector.matches({"app": "web", "tier": "fe", "zone": "z", "legacy": "1"})
    assert not selector.matches({"app": "web", "tier": "fe", "zone": "z", "env": "prod"})
    assert not selector.matches({"app": "web", "tier": "x", "zone": "z"})
    with pytest.raises(SelectorError):
        label_selector_from_object({"matchExpressions": [{"key": "a", "operator": "Bogus"}]})
    with pytest.raises(SelectorError):
        label_selector_from_object({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]})


@pytest.mark.parametrize(
    ("text", "fields", "expected"),
    [
        ("", {}, True),
        ("metadata.name=x", {"metadata.name": "x"}, True),
        ("metadata.name==x", {"metadata.name": "y"}, False),
        ("status.phase!=Running", {"status.phase": "Pending"}, True),
        ("a=b,c=d", {"a": "b", "c": "d"}, True),
        ("a=b,c=d", {"a": "b", "c": "x"}, False),
        (r"a=x\,y", {"a": "x,y"}, True),
        ("a=", {}, True),
    ],
)
def test_field_selector(text: str, fields: dict[str, str], expected: bool) -> None:
    assert parse_field_selector(text).matches(fields) is expected


@pytest.mark.parametrize("text", ["a", "=x", "a=b=c", "a=x\\", r"a=\q", "a!b"])
def test_field_selector_rejections(text: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_field_selector(text)
    assert str(info.value)


@given(st.text(max_size=60))
def test_label_selector_parser_never_crashes(text: str) -> None:
    try:
        selector = parse_label_selector(text)
    except SelectorError as exc:
        assert str(exc)
    else:
        assert isinstance(selector, LabelSelector)
        selector.matches({"a": "b"})


@given(st.text(max_size=60))
def test_field_selector_parser_never_crashes(text: str) -> None:
    try:
        selector = parse_field_selector(text)
    except SelectorError as exc:
        assert str(exc)
    else:
        assert isinstance(selector, FieldSelector)


# Keys and values "in" and "notin" included: they are words there, as in apimachinery's parser.
_key = st.one_of(st.sampled_from(["in", "notin"]), st.from_regex(r"\A[a-z][a-z0-9]{0,8}\Z"))
_value = st.one_of(st.sampled_from(["in", "notin"]), st.from_regex(r"\A[a-z0-9]{0,8}\Z"))


@given(st.dictionaries(_key, _value, max_size=5), st.dictionaries(_key, _value, max_size=5))
def test_equality_selectors_agree_with_dict_semantics(required: dict[str, str], labels: dict[str, str]) -> None:
    text = ",".join(f"{k}={v}" for k, v in required.items())
    expected = all(labels.get(k) == v for k, v in required.items())
    assert parse_label_selector(text).matches(labels) is expected
