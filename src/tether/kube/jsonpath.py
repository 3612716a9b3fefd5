r"""kubectl-compatible JSONPath templates over decoded JSON (in-house, stack.md §7).

Implements the template language documented at kubernetes.io "JSONPath Support" (the one ``kubectl -o
jsonpath=...`` takes), written from that documentation and checked against the real kubectl in the tests:

- literal text outside ``{...}``, and quoted literals inside (``{"\n"}``, ``{'x'}``);
- ``@`` / ``$`` (the current object), ``.field``, ``.field\.with\.dots``, ``.*``, ``..field`` (recursive);
- ``[n]``, ``[-n]``, ``[start:end:step]``, ``[*]``, ``['key']`` (the key is itself a dotted path, as in
  kubectl), unions ``[0,2]`` / ``['a','b']``;
- filters ``[?(@.x == "v")]`` with ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` and bare existence ``[?(@.x)]``;
- ``{range <path>}...{end}`` blocks, nestable.

Evaluation never raises: missing keys, type mismatches and out-of-range indexes select nothing (kubectl's
default ``--allow-missing-template-keys``, extended to indexes, so one odd object does not fail a watch).

Two outputs: :meth:`JsonPath.find` returns the selected values in template order (the Graph API's ``j``
array, seed 002 "Set a vertex"), :meth:`JsonPath.render` prints them as kubectl does (strings raw,
objects/arrays as compact JSON with sorted keys, values of one expression separated by a space).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JsonPath", "JsonPathError", "parse_jsonpath"]

_FIELD_TERMINATORS = frozenset(" \t\n.[]{}(),=!<>@$'\"")
_SLICE = re.compile(r"^(-?[0-9]*)(?::(-?[0-9]*))?(?::(-?[0-9]*))?$")
_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?)$")
_MAX_NUMBER_LENGTH = 40
_FILTER_OPS = ("==", "!=", "<=", ">=", "<", ">")


class JsonPathError(ValueError):
    """The template does not parse; the message says where and why."""


# ---- syntax tree ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    name: str


@dataclass(frozen=True)
class _Wildcard:
    pass


@dataclass(frozen=True)
class _Recursive:
    pass


@dataclass(frozen=True)
class _Slice:
    start: int | None
    end: int | None
    step: int | None
    single: bool  # "[n]": one element


@dataclass(frozen=True)
class _Literal:
    value: Any


@dataclass(frozen=True)
class _Union:
    branches: tuple[tuple[_Step, ...], ...]


@dataclass(frozen=True)
class _Filter:
    left: tuple[_Step, ...]
    op: str | None  # None: existence test
    right: tuple[_Step, ...]


_Step = _Field | _Wildcard | _Recursive | _Slice | _Literal | _Union | _Filter


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Expr:
    steps: tuple[_Step, ...]


@dataclass(frozen=True)
class _Range:
    steps: tuple[_Step, ...]
    body: tuple[_Node, ...]


_Node = _Text | _Expr | _Range


# ---- parsing ---------------------------------------------------------------------------------------


def parse_jsonpath(template: str) -> JsonPath:
    r"""Parse a kubectl JSONPath template.

    A template without any ``{`` that starts with ``.`` or ``$`` is wrapped in ``{...}`` (so ``.metadata.name``
    means ``{.metadata.name}``, as kubectl's custom columns relax it).

    Args:
        template: e.g. ``{.metadata.name}{"\n"}`` or ``{range .items[*]}{.n},{end}``.

    Raises:
        JsonPathError: unclosed action or range, unknown identifier, bad index, bad filter, ...
    """
    if "{" not in template and template.startswith((".", "$")):
        template = "{" + template + "}"
    nodes, rest = _parse_nodes(template, 0, template, in_range=False)
    if rest != len(template):  # pragma: no cover - _parse_nodes consumes everything at top level
        raise JsonPathError(f"jsonpath {template!r}: unexpected {{end}}")
    return JsonPath(template, tuple(nodes))


def _parse_nodes(text: str, pos: int, template: str, *, in_range: bool) -> tuple[list[_Node], int]:
    nodes: list[_Node] = []
    while pos < len(text):
        brace = text.find("{", pos)
        if brace < 0:
            nodes.append(_Text(text[pos:]))
            pos = len(text)
            break
        if brace > pos:
            nodes.append(_Text(text[pos:brace]))
        close = _find_action_end(text, brace + 1, template)
        action = text[brace + 1 : close].strip()
        pos = close + 1
        keyword, _, rest = action.partition(" ")
        if keyword == "end" and not rest.strip():
            if not in_range:
                raise JsonPathError(f"jsonpath {template!r}: {{end}} without {{range}}")
            return nodes, pos
        if keyword == "range":
            steps = _parse_steps(rest.strip(), template)
            body, pos = _parse_nodes(text, pos, template, in_range=True)
            nodes.append(_Range(steps, tuple(body)))
            continue
        nodes.append(_Expr(_parse_steps(action, template)))
    if in_range:
        raise JsonPathError(f"jsonpath {template!r}: {{range}} without {{end}}")
    return nodes, pos


def _find_action_end(text: str, pos: int, template: str) -> int:
    quote: str | None = None
    while pos < len(text):
        ch = text[pos]
        if quote:
            if ch == "\\":
                pos += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "}":
            return pos
        pos += 1
    raise JsonPathError(f"jsonpath {template!r}: unclosed action")


def _parse_steps(action: str, template: str) -> tuple[_Step, ...]:
    steps: list[_Step] = []
    pos = 0
    n = len(action)
    while pos < n:
        ch = action[pos]
        if ch.isspace() or ch in "@$":
            pos += 1
        elif action.startswith("..", pos):
            steps.append(_Recursive())
            pos += 1  # the second "." starts the field that follows
            if pos + 1 < n and action[pos + 1] == "[":
                pos += 1
        elif ch == ".":
            pos = _parse_field(action, pos + 1, steps, template)
        elif action.startswith("[?(", pos):
            end = action.find(")]", pos)
            if end < 0:
                raise JsonPathError(f"jsonpath {template!r}: unclosed filter")
            steps.append(_parse_filter(action[pos + 3 : end], template))
            pos = end + 2
        elif ch == "[":
            end = _find_bracket_end(action, pos + 1, template)
            steps.append(_parse_bracket(action[pos + 1 : end], template))
            pos = end + 1
        elif ch in "\"'":
            value, pos = _parse_quoted(action, pos, template)
            steps.append(_Literal(value))
        elif ch in "+-0123456789":
            end = pos + 1
            while end < n and (action[end].isalnum() or action[end] in ".+-"):
                end += 1
            token = action[pos:end]
            if len(token) > _MAX_NUMBER_LENGTH or not _NUMBER.match(token):
                raise JsonPathError(f"jsonpath {template!r}: invalid number {token!r}")
            steps.append(_Literal(float(token) if any(c in token for c in ".eE") else int(token)))
            pos = end
        elif ch.isalpha() or ch == "_":
            end = pos
            while end < n and (action[end].isalnum() or action[end] == "_"):
                end += 1
            word = action[pos:end]
            if word not in ("true", "false"):
                raise JsonPathError(f"jsonpath {template!r}: unrecognized identifier {word!r}")
            steps.append(_Literal(word == "true"))
            pos = end
        else:
            raise JsonPathError(f"jsonpath {template!r}: unrecognized character {ch!r} in action")
    return tuple(steps)


def _parse_field(action: str, pos: int, steps: list[_Step], template: str) -> int:
    if pos < len(action) and action[pos] == "*":
        steps.append(_Wildcard())
        return pos + 1
    name: list[str] = []
    while pos < len(action):
        ch = action[pos]
        if ch == "\\" and pos + 1 < len(action):
            name.append(action[pos + 1])
            pos += 2
            continue
        if ch in _FIELD_TERMINATORS:
            break
        name.append(ch)
        pos += 1
    if name:
        steps.append(_Field("".join(name)))
    return pos


def _find_bracket_end(action: str, pos: int, template: str) -> int:
    quote: str | None = None
    while pos < len(action):
        ch = action[pos]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "]":
            return pos
        pos += 1
    raise JsonPathError(f"jsonpath {template!r}: unterminated array")


def _parse_bracket(content: str, template: str) -> _Step:
    content = content.strip()
    parts = _split_top_level(content, ",")
    if len(parts) > 1:
        return _Union(tuple(_bracket_steps(part.strip(), template) for part in parts))
    steps = _bracket_steps(content, template)
    return steps[0] if len(steps) == 1 else _Union((steps,))


def _bracket_steps(content: str, template: str) -> tuple[_Step, ...]:
    if content == "*":
        return (_Wildcard(),)
    if len(content) >= 2 and content[0] == content[-1] and content[0] in "'\"":
        key = content[1:-1]
        # kubectl parses ['a.b'] as the path .a.b; escape dots ('a\.b') for a literal key.
        return _parse_steps("." + key, template) if key else (_Field(""),)
    match = _SLICE.match(content)
    if not match or content == "" or len(content) > _MAX_NUMBER_LENGTH:
        raise JsonPathError(f"jsonpath {template!r}: invalid array index {content!r}")
    start, end, step = (int(g) if g not in (None, "") else None for g in match.groups())
    if step == 0:
        raise JsonPathError(f"jsonpath {template!r}: slice step cannot be 0")
    return (_Slice(start, end, step, single=":" not in content),)


def _split_top_level(content: str, separator: str) -> list[str]:
    parts: list[str] = []
    quote: str | None = None
    current: list[str] = []
    for ch in content:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == separator:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def _parse_quoted(action: str, pos: int, template: str) -> tuple[str, int]:
    quote = action[pos]
    out: list[str] = []
    pos += 1
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
    while pos < len(action):
        ch = action[pos]
        if ch == "\\" and pos + 1 < len(action):
            nxt = action[pos + 1]
            out.append(escapes.get(nxt, "\\" + nxt))
            pos += 2
            continue
        if ch == quote:
            return "".join(out), pos + 1
        out.append(ch)
        pos += 1
    raise JsonPathError(f"jsonpath {template!r}: unterminated quoted string")


def _parse_filter(expression: str, template: str) -> _Filter:
    quote: str | None = None
    for index, ch in enumerate(expression):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
            continue
        for op in _FILTER_OPS:
            if expression.startswith(op, index):
                left = _parse_steps(expression[:index].strip(), template)
                right = _parse_steps(expression[index + len(op) :].strip(), template)
                if not right:
                    raise JsonPathError(f"jsonpath {template!r}: filter {expression!r} has no right operand")
                return _Filter(left, op, right)
    return _Filter(_parse_steps(expression.strip(), template), None, ())


# ---- evaluation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonPath:
    """A parsed template; immutable and safe to share.

    Attributes:
        template: the (possibly relaxed) template text.
    """

    template: str
    nodes: tuple[_Node, ...] = field(repr=False)

    def find(self, data: Any) -> list[Any]:
        """All values the template selects from ``data``, in order; literal text is included as strings.

        Args:
            data: decoded JSON (dicts, lists, str, int, float, bool, None).
        """
        out: list[Any] = []
        for group in _walk_nodes(self.nodes, data):
            out.extend(group)
        return out

    def render(self, data: Any) -> str:
        """The text kubectl prints for this template (``kubectl get -o jsonpath=...``)."""
        return "".join(" ".join(_print(v) for v in group) for group in _walk_nodes(self.nodes, data))


def _walk_nodes(nodes: tuple[_Node, ...], data: Any) -> Iterator[list[Any]]:
    for node in nodes:
        if isinstance(node, _Text):
            yield [node.text]
        elif isinstance(node, _Expr):
            yield _apply(node.steps, [data])
        else:
            for item in _apply(node.steps, [data]):
                yield from _walk_nodes(node.body, item)


def _apply(steps: tuple[_Step, ...], values: list[Any]) -> list[Any]:
    for step in steps:
        values = _step(step, values)
    return values


def _step(step: _Step, values: list[Any]) -> list[Any]:
    out: list[Any] = []
    if isinstance(step, _Field):
        for value in values:
            if isinstance(value, dict) and step.name in value:
                out.append(value[step.name])
    elif isinstance(step, _Wildcard):
        for value in values:
            if isinstance(value, dict):
                out.extend(value.values())
            elif isinstance(value, list):
                out.extend(value)
    elif isinstance(step, _Recursive):
        for value in values:
            out.extend(_descendants(value))
    elif isinstance(step, _Slice):
        for value in values:
            if isinstance(value, list):
                out.extend(_slice(step, value))
    elif isinstance(step, _Literal):
        out = [step.value]
    elif isinstance(step, _Union):
        for branch in step.branches:
            out.extend(_apply(branch, values))
    else:
        for value in values:
            if isinstance(value, list):
                out.extend(item for item in value if _filter_matches(step, item))
    return out


def _descendants(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for child in value.values():
            yield from _descendants(child)
    elif isinstance(value, list):
        for child in value:
            yield from _descendants(child)


def _slice(step: _Slice, items: list[Any]) -> list[Any]:
    length = len(items)
    if step.single:
        index = step.start if step.start is not None else 0
        if index < 0:
            index += length
        return [items[index]] if 0 <= index < length else []
    start = step.start if step.start is not None else 0
    end = step.end if step.end is not None else length
    if start < 0:
        start += length
    if end < 0:
        end += length
    start = max(0, min(start, length))
    end = max(0, min(end, length))
    return items[start : end : step.step or 1] if step.step is None or step.step > 0 else []


def _filter_matches(step: _Filter, item: Any) -> bool:
    left = _apply(step.left, [item])
    if step.op is None:
        return bool(left)
    right = _apply(step.right, [item])
    if not left or not right:
        return False
    return any(_compare(a, step.op, b) for a in left for b in right)


def _compare(a: Any, op: str, b: Any) -> bool:
    numeric = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        if not (isinstance(a, bool) and isinstance(b, bool)):
            return op == "!="
    elif (isinstance(a, numeric) and isinstance(b, numeric)) or (isinstance(a, str) and isinstance(b, str)):
        pass
    else:
        if op in ("==", "!="):
            return bool(a == b) == (op == "==")
        return False
    if op == "==":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    if isinstance(a, bool):
        return False
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _print(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _go_float(value: float) -> str:
    """Format like Go's ``%v`` for float64 (shortest representation, exponent at >= 1e21 or < 1e-4)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        sign = "-" if exponent.startswith("-") else "+"
        digits = exponent.lstrip("+-").rjust(2, "0")
        return f"{mantissa}e{sign}{digits}"
    return text
