r"""Kubernetes label and field selectors: parsing, validation and matching (in-house, stack.md §7).

Written from the documented grammar (kubernetes.io "Labels and Selectors" / "Field Selectors") so that a
selector the API server accepts parses here and one it rejects is rejected here with a reason. Used by the
Graph API to validate ``label_selector`` / ``field_selector`` before they are sent to the API server, and
to match ``Service`` / ``PodDisruptionBudget`` / ``NetworkPolicy`` selectors against object labels.

Label selector string grammar (requirements joined by ``,``, whitespace allowed around tokens)::

    key            the label exists
    !key           the label does not exist
    key = v, key == v, key != v
    key in (v1, v2), key notin (v1, v2)
    key > 5, key < 5       integer comparison

Field selector string grammar: ``field=value``, ``field==value``, ``field!=value`` joined by ``,``; ``\``
escapes ``,``, ``=``, ``!`` and ``\`` inside values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelRequirement",
    "LabelSelector",
    "Operator",
    "SelectorError",
    "label_selector_from_object",
    "parse_field_selector",
    "parse_label_selector",
    "validate_label_key",
    "validate_label_value",
]

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_INTEGER = re.compile(r"^-?[0-9]+$")


class SelectorError(ValueError):
    """The selector text is not valid; the message says where and why."""


class Operator(Enum):
    """Label requirement operators (apimachinery ``selection.Operator``)."""

    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


def validate_label_key(key: str) -> None:
    """Check a label key: optional DNS-subdomain prefix (<= 253 chars) + ``/`` + name (<= 63 chars).

    Raises:
        SelectorError: the key is invalid.
    """
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            raise SelectorError(f"invalid label key {key!r}: prefix part must be non-empty")
        if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            raise SelectorError(f"invalid label key {key!r}: prefix part must be a DNS-1123 subdomain")
    if not name:
        raise SelectorError(f"invalid label key {key!r}: name part must be non-empty")
    if len(name) > 63 or not _NAME.match(name):
        raise SelectorError(
            f"invalid label key {key!r}: name part must be at most 63 alphanumeric characters, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )


def validate_label_value(value: str) -> None:
    """Check a label value: empty, or at most 63 characters of ``[-A-Za-z0-9_.]`` with alphanumeric ends.

    Raises:
        SelectorError: the value is invalid.
    """
    if value and (len(value) > 63 or not _NAME.match(value)):
        raise SelectorError(
            f"invalid label value {value!r}: must be empty or at most 63 alphanumeric characters, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )


@dataclass(frozen=True)
class LabelRequirement:
    """One requirement: ``key`` ``operator`` ``values`` (values empty for exists / does-not-exist)."""

    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` (label key -> value) satisfy this requirement."""
        op = self.operator
        present = self.key in labels
        if op is Operator.EXISTS:
            return present
        if op is Operator.DOES_NOT_EXIST:
            return not present
        if op in (Operator.EQUALS, Operator.IN):
            return present and labels[self.key] in self.values
        if op in (Operator.NOT_EQUALS, Operator.NOT_IN):
            return not present or labels[self.key] not in self.values
        # gt / lt: the label must exist and hold an integer.
        if not present or not _INTEGER.match(labels[self.key]):
            return False
        bound = int(next(iter(self.values)))
        have = int(labels[self.key])
        return have > bound if op is Operator.GREATER_THAN else have < bound


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements. No requirements matches everything; ``nothing`` matches nothing.

    Attributes:
        requirements: all must hold.
        nothing: the selector selects no object (a nil ``LabelSelector`` in a spec).
    """

    requirements: tuple[LabelRequirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with ``labels`` is selected."""
        if self.nothing:
            return False
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True when the selector matches every object."""
        return not self.nothing and not self.requirements

    def equality_pair(self) -> tuple[str, str] | None:
        """A ``(key, value)`` label every selected object must carry (for indexing), or None if there is none."""
        if self.nothing:
            return None
        for requirement in self.requirements:
            if requirement.operator is Operator.EQUALS or (
                requirement.operator is Operator.IN and len(requirement.values) == 1
            ):
                return requirement.key, next(iter(requirement.values))
        return None


class _Lexer:
    """Tokens of a label selector: identifiers/values, operators, ``(``, ``)``, ``,``."""

    _SPECIAL = "!=<>(),"

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def tokens(self) -> Iterator[tuple[str, str, int]]:
        text = self.text
        while True:
            while self.pos < len(text) and text[self.pos].isspace():
                self.pos += 1
            if self.pos >= len(text):
                yield ("end", "", self.pos)
                return
            start = self.pos
            ch = text[start]
            if ch in "(),":
                self.pos += 1
                yield (ch, ch, start)
            elif ch in "!=<>":
                two = text[start : start + 2]
                if two in ("==", "!="):
                    self.pos += 2
                    yield (two, two, start)
                else:
                    self.pos += 1
                    yield (ch, ch, start)
            else:
                while self.pos < len(text) and not text[self.pos].isspace() and text[self.pos] not in self._SPECIAL:
                    self.pos += 1
                word = text[start : self.pos]
                kind = word if word in ("in", "notin") else "word"
                yield (kind, word, start)


#: Tokens that stand for a key or a value: ``in`` and ``notin`` are operators only where an operator is expected
#: (apimachinery's parser reads keys and values in its ``Values`` context, where they are identifiers):
#: ``in=notin`` selects label ``in`` equal to ``notin``.
_WORDS = ("word", "in", "notin")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a label selector string (e.g. ``app=web,tier in (a,b),!legacy``).

    Args:
        text: the selector; empty or blank selects everything.

    Raises:
        SelectorError: syntax error, invalid key/value, empty value set, or non-integer bound of ``<``/``>``.
    """
    tokens = list(_Lexer(text).tokens())
    index = 0
    requirements: list[LabelRequirement] = []

    def peek() -> tuple[str, str, int]:
        return tokens[index]

    def take() -> tuple[str, str, int]:
        nonlocal index
        token = tokens[index]
        index += 1
        return token

    if peek()[0] == "end":
        return LabelSelector()
    while True:
        kind, value, pos = take()
        if kind == "!":
            kind, key, pos = take()
            if kind not in _WORDS:
                raise SelectorError(f"label selector {text!r}: expected a label key after '!' at position {pos}")
            validate_label_key(key)
            requirements.append(LabelRequirement(key, Operator.DOES_NOT_EXIST))
        elif kind in _WORDS:
            key = value
            validate_label_key(key)
            kind, value, pos = peek()
            if kind in (",", "end"):
                requirements.append(LabelRequirement(key, Operator.EXISTS))
            elif kind in ("=", "==", "!="):
                operator = Operator.NOT_EQUALS if kind == "!=" else Operator.EQUALS
                take()
                kind, value, pos = peek()
                if kind in _WORDS:
                    take()
                elif kind in (",", "end"):
                    value = ""
                else:
                    raise SelectorError(f"label selector {text!r}: expected a value at position {pos}")
                validate_label_value(value)
                requirements.append(LabelRequirement(key, operator, frozenset([value])))
            elif kind in ("in", "notin"):
                take()
                requirements.append(LabelRequirement(key, Operator(kind), _parse_set(text, tokens, index)))
                while take()[0] != ")":
                    pass
            elif kind in (">", "<"):
                take()
                kind, bound, pos = take()
                if kind != "word" or not _INTEGER.match(bound):
                    raise SelectorError(f"label selector {text!r}: expected an integer at position {pos}")
                op = Operator.GREATER_THAN if value == ">" else Operator.LESS_THAN
                requirements.append(LabelRequirement(key, op, frozenset([bound])))
            else:
                raise SelectorError(
                    f"label selector {text!r}: expected one of '=', '==', '!=', 'in', 'notin', '<', '>', ',' "
                    f"after key {key!r} at position {pos}"
                )
        else:
            raise SelectorError(f"label selector {text!r}: expected a label key or '!' at position {pos}")
        kind, value, pos = take()
        if kind == "end":
            return LabelSelector(tuple(requirements))
        if kind != ",":
            raise SelectorError(f"label selector {text!r}: expected ',' or end at position {pos}")
        if peek()[0] == "end":
            raise SelectorError(f"label selector {text!r}: trailing ','")


def _parse_set(text: str, tokens: list[tuple[str, str, int]], index: int) -> frozenset[str]:
    """Values of ``( v1, v2 )`` starting at ``tokens[index]`` (which must be ``(``); the caller skips them."""
    kind, _, pos = tokens[index]
    if kind != "(":
        raise SelectorError(f"label selector {text!r}: expected '(' at position {pos}")
    values: list[str] = []
    index += 1
    expect_value = True
    while True:
        kind, value, pos = tokens[index]
        index += 1
        if kind == ")":
            if expect_value and values:
                values.append("")  # "(a,)" has an empty value
            break
        if kind == "end":
            raise SelectorError(f"label selector {text!r}: missing ')'")
        if kind == ",":
            if expect_value:
                values.append("")
            expect_value = True
            continue
        if kind not in _WORDS or not expect_value:
            raise SelectorError(f"label selector {text!r}: unexpected {value!r} in value set at position {pos}")
        values.append(value)
        expect_value = False
    if not values:
        raise SelectorError(f"label selector {text!r}: for 'in' and 'notin' the value set must not be empty")
    for value in values:
        validate_label_value(value)
    return frozenset(values)


def label_selector_from_object(selector: Any) -> LabelSelector:
    """Convert a ``metav1.LabelSelector`` object (``matchLabels`` + ``matchExpressions``).

    Args:
        selector: the decoded JSON object, or None (a nil selector selects nothing, as for a PDB or
            NetworkPolicy field that is absent); ``{}`` selects everything.

    Raises:
        SelectorError: an unknown operator, or values that do not fit the operator.
    """
    if selector is None:
        return LabelSelector(nothing=True)
    if not isinstance(selector, Mapping):
        raise SelectorError("label selector must be an object")
    requirements: list[LabelRequirement] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        requirements.append(LabelRequirement(str(key), Operator.EQUALS, frozenset([str(value)])))
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, Mapping):
            raise SelectorError("matchExpressions entries must be objects")
        key = str(expression.get("key", ""))
        operator = str(expression.get("operator", ""))
        values = frozenset(str(v) for v in expression.get("values") or [])
        if operator in ("In", "NotIn"):
            if not values:
                raise SelectorError(f"matchExpressions {key!r}: {operator} needs values")
            requirements.append(LabelRequirement(key, Operator.IN if operator == "In" else Operator.NOT_IN, values))
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                raise SelectorError(f"matchExpressions {key!r}: {operator} takes no values")
            op = Operator.EXISTS if operator == "Exists" else Operator.DOES_NOT_EXIST
            requirements.append(LabelRequirement(key, op))
        else:
            raise SelectorError(f"matchExpressions {key!r}: unknown operator {operator!r}")
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldRequirement:
    """``field`` equals (or, with ``negate``, differs from) ``value``."""

    field: str
    value: str
    negate: bool = False


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of field requirements; empty matches everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether an object whose selectable fields are ``fields`` (e.g. ``{"metadata.name": "x"}``) matches.

        A field that is absent compares as the empty string, as the API server does.
        """
        for requirement in self.requirements:
            equal = fields.get(requirement.field, "") == requirement.value
            if equal == requirement.negate:
                return False
        return True


def parse_field_selector(text: str) -> FieldSelector:
    """Parse a field selector string (e.g. ``metadata.name=x,status.phase!=Running``).

    Args:
        text: the selector; empty or blank selects everything.

    Raises:
        SelectorError: a term without an operator, an empty field name, or a bad escape.
    """
    if not text.strip():
        return FieldSelector()
    requirements: list[FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        requirements.append(_parse_field_term(text, term))
    return FieldSelector(tuple(requirements))


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if escaped:
        raise SelectorError(f"field selector {text!r}: dangling escape '\\' at the end")
    parts.append("".join(current))
    return parts


def _parse_field_term(text: str, term: str) -> FieldRequirement:
    # Find the first unescaped operator: "!=", "==" or "=".
    i = 0
    while i < len(term):
        ch = term[i]
        if ch == "\\":
            i += 2
            continue
        if term.startswith("!=", i) or term.startswith("==", i) or ch == "=":
            op_len = 2 if term.startswith(("!=", "=="), i) else 1
            field = term[:i].strip()
            if not field:
                raise SelectorError(f"field selector {text!r}: term {term!r} has an empty field name")
            raw_value = term[i + op_len :]
            return FieldRequirement(field, _unescape(text, raw_value), negate=term.startswith("!=", i))
        if ch == "!":
            break
        i += 1
    raise SelectorError(
        f"field selector {text!r}: term {term!r} must be 'field=value', 'field==value' or 'field!=value'"
    )


def _unescape(text: str, value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            nxt = value[i + 1] if i + 1 < len(value) else ""
            if nxt not in ("\\", ",", "=", "!"):
                raise SelectorError(f"field selector {text!r}: invalid escape sequence '\\{nxt}'")
            out.append(nxt)
            i += 2
            continue
        if ch in ("=", "!"):
            raise SelectorError(f"field selector {text!r}: unescaped {ch!r} in value {value!r}")
        out.append(ch)
        i += 1
    return "".join(out)
