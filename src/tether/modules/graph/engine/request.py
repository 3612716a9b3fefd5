"""The Graph API watch request: JSON decoding, validation and compilation (seed 002 "Client request").

The same validator runs in kas (before anything is sent to the agent, so the client gets a precise close
reason) and in agentk (which must not trust its input). :func:`parse_request` turns the client's first
WebSocket message into a :class:`GraphRequest` or raises :class:`RequestError` naming the offending field,
e.g. ``queries[1].include.object.label_selector: ...``.

Rules enforced (seed 002 "queries", "namespaces", "roots"):

- the message is a JSON object with only the known fields (unknown fields are rejected);
- ``queries`` is required and has at least one element; each query has exactly one of ``include`` /
  ``exclude``, each with a ``resource_selector_expression`` that compiles and is of type bool;
- ``include.object``: ``label_selector`` and ``field_selector`` parse, ``object_selector_expression``
  compiles to bool, ``json_path`` parses as a kubectl JSONPath template;
- ``namespaces``: ``names`` (valid namespace names) selects list mode, otherwise ``label_selector`` /
  ``field_selector`` / ``object_selector_expression`` select all-namespaces mode; no filter at all means
  cluster-wide watches. In list mode the selectors and the expression further filter the listed namespaces
  (a namespace is watched when it is listed and passes every filter given): the seed's own example request
  sends ``names`` together with ``label_selector`` (issue 27 item 8), and upstream's reference describes the
  fields as filters on the namespaces watched, with no rule that excludes one of them;
- ``roots.object_selector_expressions`` compile to bool; ``roots.ignore_arc_direction`` holds arc types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import msgspec

from tether.kube.jsonpath import JsonPath, JsonPathError, parse_jsonpath
from tether.kube.selectors import SelectorError, parse_field_selector, parse_label_selector
from tether.modules.graph.engine.cel import (
    CelCompileError,
    CelProgram,
    compile_object_expression,
    compile_resource_expression,
)

__all__ = [
    "ARC_TYPES",
    "MAX_REQUEST_BYTES",
    "ExcludeQuery",
    "GraphRequest",
    "IncludeQuery",
    "NamespaceMode",
    "NamespaceSelection",
    "Namespaces",
    "ObjectFilter",
    "ObjectQuery",
    "Query",
    "RequestError",
    "RootSelection",
    "Roots",
    "SelectedQuery",
    "WatchRequest",
    "compile_request",
    "decode_request",
    "encode_request",
    "parse_request",
]

#: Arc type codes (seed 002 "Types of arcs").
ARC_TYPES = ("or", "r", "t")
#: Largest request message accepted, in bytes.
MAX_REQUEST_BYTES = 1 << 20
#: Upper bounds on list lengths, to bound compile work and memory.
MAX_QUERIES = 1000
MAX_NAMESPACES = 10_000
MAX_ROOT_EXPRESSIONS = 1000
MAX_SELECTOR_LENGTH = 10_000

_NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class RequestError(ValueError):
    """The request is invalid.

    Attributes:
        field: where, as a path (``queries[0].include.resource_selector_expression``), or ``request`` for
            the message as a whole.
        reason: what is wrong.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# ---- wire structs (field names as in the seed) ---------------------------------------------------


class ObjectQuery(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``include.object``: which objects of the matched resources to watch and what to return."""

    label_selector: str = ""
    field_selector: str = ""
    object_selector_expression: str = ""
    json_path: str = ""


class IncludeQuery(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``include``: watch the matched group+version+resource triples."""

    resource_selector_expression: str = ""
    object: ObjectQuery | None = None


class ExcludeQuery(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``exclude``: drop the matched triples from further consideration."""

    resource_selector_expression: str = ""


class Query(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One element of ``queries``: exactly one of ``include`` / ``exclude``."""

    include: IncludeQuery | None = None
    exclude: ExcludeQuery | None = None


class Namespaces(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``namespaces``: list mode (``names``) or all-namespaces mode (selectors)."""

    names: list[str] = msgspec.field(default_factory=list)
    label_selector: str = ""
    field_selector: str = ""
    object_selector_expression: str = ""


class Roots(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``roots``: CEL expressions selecting root objects, and arc types to treat as undirected."""

    object_selector_expressions: list[str] = msgspec.field(default_factory=list)
    ignore_arc_direction: list[str] = msgspec.field(default_factory=list)


class WatchRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The client's request message (seed 002 "Client request")."""

    queries: list[Query] = msgspec.field(default_factory=list)
    namespaces: Namespaces | None = None
    roots: Roots | None = None


# ---- compiled form --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectFilter:
    """Compiled ``include.object``.

    Attributes:
        label_selector: sent to the API server as ``labelSelector`` ("" for none).
        field_selector: sent to the API server as ``fieldSelector`` ("" for none).
        expression: evaluated in agentk on every object, or None.
        json_path: projection returned as ``j``, or None to return the object as ``o``.
    """

    label_selector: str = ""
    field_selector: str = ""
    expression: CelProgram | None = None
    json_path: JsonPath | None = None


@dataclass(frozen=True)
class SelectedQuery:
    """One compiled query.

    Attributes:
        index: position in ``queries`` (for messages).
        include: True for ``include``, False for ``exclude``.
        resource_expression: the ``resource_selector_expression``.
        object_filter: compiled ``include.object`` (an empty filter for ``exclude``).
    """

    index: int
    include: bool
    resource_expression: CelProgram
    object_filter: ObjectFilter


class NamespaceMode(Enum):
    """How namespaces are chosen (seed 002 "namespaces")."""

    CLUSTER = "cluster"  # no filtering: cluster-wide watches
    LIST = "list"  # namespaces.names
    ALL = "all"  # every namespace passing label/field/CEL filters


@dataclass(frozen=True)
class NamespaceSelection:
    """Compiled ``namespaces``.

    Attributes:
        mode: see :class:`NamespaceMode`.
        names: list mode: the namespaces (deduplicated, in request order).
        label_selector: sent to the API server when listing namespaces (both modes; in list mode it narrows
            the listed namespaces).
        field_selector: as ``label_selector``.
        expression: CEL over each Namespace object (both modes), or None.
    """

    mode: NamespaceMode = NamespaceMode.CLUSTER
    names: tuple[str, ...] = ()
    label_selector: str = ""
    field_selector: str = ""
    expression: CelProgram | None = None


@dataclass(frozen=True)
class RootSelection:
    """Compiled ``roots``; no expressions means no root filtering.

    Attributes:
        expressions: OR-ed, evaluated in order.
        undirected: arc types whose direction is ignored for reachability.
    """

    expressions: tuple[CelProgram, ...] = ()
    undirected: frozenset[str] = frozenset()

    @property
    def enabled(self) -> bool:
        """True when root filtering applies."""
        return bool(self.expressions)


@dataclass(frozen=True)
class GraphRequest:
    """A validated, compiled request.

    Attributes:
        queries: in request order (first match wins).
        namespaces: namespace selection.
        roots: root selection.
        source: the decoded request (for forwarding to the agent).
    """

    queries: tuple[SelectedQuery, ...]
    namespaces: NamespaceSelection
    roots: RootSelection
    source: WatchRequest


# ---- decoding and compilation ---------------------------------------------------------------------

_DECODER = msgspec.json.Decoder(WatchRequest)
_ERROR_PATH = re.compile(r"^(?P<message>.*?) - at `\$(?P<path>[^`]*)`$", re.S)


def decode_request(data: bytes | str) -> WatchRequest:
    """Decode the JSON message into :class:`WatchRequest` without semantic checks.

    Raises:
        RequestError: too large, not JSON, not an object, wrong types or unknown fields.
    """
    size = len(data.encode() if isinstance(data, str) else data)
    if size > MAX_REQUEST_BYTES:
        raise RequestError("request", f"message is {size} bytes, more than the {MAX_REQUEST_BYTES} allowed")
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc).replace("Object contains unknown field", "unknown field")
        match = _ERROR_PATH.match(text)
        if match is None:
            raise RequestError("request", text) from None
        raise RequestError(match.group("path").lstrip(".") or "request", match.group("message")) from None
    except msgspec.DecodeError as exc:
        raise RequestError("request", f"invalid JSON: {exc}") from None


def parse_request(data: bytes | str) -> GraphRequest:
    """Decode, validate and compile the client's request message.

    Raises:
        RequestError: the message or one of its fields is invalid.
    """
    return compile_request(decode_request(data))


def compile_request(request: WatchRequest) -> GraphRequest:
    """Validate and compile a decoded request.

    Raises:
        RequestError: naming the invalid field.
    """
    if not request.queries:
        raise RequestError("queries", "at least one query is required")
    if len(request.queries) > MAX_QUERIES:
        raise RequestError("queries", f"at most {MAX_QUERIES} queries are allowed")
    queries = tuple(_compile_query(i, q) for i, q in enumerate(request.queries))
    namespaces = _compile_namespaces(request.namespaces)
    roots = _compile_roots(request.roots)
    return GraphRequest(queries=queries, namespaces=namespaces, roots=roots, source=request)


def _compile_query(index: int, query: Query) -> SelectedQuery:
    where = f"queries[{index}]"
    if (query.include is None) == (query.exclude is None):
        raise RequestError(where, "exactly one of include or exclude must be set")
    if query.exclude is not None:
        expression = _resource_cel(
            f"{where}.exclude.resource_selector_expression", query.exclude.resource_selector_expression
        )
        return SelectedQuery(index, include=False, resource_expression=expression, object_filter=ObjectFilter())
    include = query.include
    assert include is not None
    expression = _resource_cel(f"{where}.include.resource_selector_expression", include.resource_selector_expression)
    return SelectedQuery(
        index, include=True, resource_expression=expression, object_filter=_compile_object(where, include.object)
    )


def _compile_object(where: str, obj: ObjectQuery | None) -> ObjectFilter:
    if obj is None:
        return ObjectFilter()
    where = f"{where}.include.object"
    _check_label_selector(f"{where}.label_selector", obj.label_selector)
    _check_field_selector(f"{where}.field_selector", obj.field_selector)
    expression = (
        _object_cel(f"{where}.object_selector_expression", obj.object_selector_expression)
        if obj.object_selector_expression
        else None
    )
    json_path: JsonPath | None = None
    if obj.json_path:
        if len(obj.json_path) > MAX_SELECTOR_LENGTH:
            raise RequestError(f"{where}.json_path", f"longer than {MAX_SELECTOR_LENGTH} characters")
        try:
            json_path = parse_jsonpath(obj.json_path)
        except JsonPathError as exc:
            raise RequestError(f"{where}.json_path", str(exc)) from None
    return ObjectFilter(obj.label_selector.strip(), obj.field_selector.strip(), expression, json_path)


def _compile_namespaces(namespaces: Namespaces | None) -> NamespaceSelection:
    if namespaces is None:
        return NamespaceSelection()
    where = "namespaces"
    if len(namespaces.names) > MAX_NAMESPACES:
        raise RequestError(f"{where}.names", f"at most {MAX_NAMESPACES} names are allowed")
    for i, name in enumerate(namespaces.names):
        if len(name) > 63 or not _NAMESPACE_NAME.match(name):
            raise RequestError(
                f"{where}.names[{i}]",
                f"{name!r} is not a valid namespace name (lowercase RFC 1123 label, at most 63 characters)",
            )
    _check_label_selector(f"{where}.label_selector", namespaces.label_selector)
    _check_field_selector(f"{where}.field_selector", namespaces.field_selector)
    expression = (
        _object_cel(f"{where}.object_selector_expression", namespaces.object_selector_expression)
        if namespaces.object_selector_expression
        else None
    )
    label, field = namespaces.label_selector.strip(), namespaces.field_selector.strip()
    if namespaces.names:
        names = tuple(dict.fromkeys(namespaces.names))
        return NamespaceSelection(NamespaceMode.LIST, names, label, field, expression)
    if not label and not field and expression is None:
        return NamespaceSelection()
    return NamespaceSelection(NamespaceMode.ALL, label_selector=label, field_selector=field, expression=expression)


def _compile_roots(roots: Roots | None) -> RootSelection:
    if roots is None:
        return RootSelection()
    where = "roots"
    if len(roots.object_selector_expressions) > MAX_ROOT_EXPRESSIONS:
        raise RequestError(f"{where}.object_selector_expressions", f"at most {MAX_ROOT_EXPRESSIONS} are allowed")
    expressions = tuple(
        _object_cel(f"{where}.object_selector_expressions[{i}]", source)
        for i, source in enumerate(roots.object_selector_expressions)
    )
    for i, arc_type in enumerate(roots.ignore_arc_direction):
        if arc_type not in ARC_TYPES:
            raise RequestError(
                f"{where}.ignore_arc_direction[{i}]",
                f"unknown arc type {arc_type!r}, expected one of {', '.join(ARC_TYPES)}",
            )
    return RootSelection(expressions, frozenset(roots.ignore_arc_direction))


def _resource_cel(where: str, source: str) -> CelProgram:
    try:
        return compile_resource_expression(source)
    except CelCompileError as exc:
        raise RequestError(where, f"invalid CEL expression: {exc}") from None


def _object_cel(where: str, source: str) -> CelProgram:
    try:
        return compile_object_expression(source)
    except CelCompileError as exc:
        raise RequestError(where, f"invalid CEL expression: {exc}") from None


def _check_label_selector(where: str, text: str) -> None:
    if len(text) > MAX_SELECTOR_LENGTH:
        raise RequestError(where, f"longer than {MAX_SELECTOR_LENGTH} characters")
    try:
        parse_label_selector(text)
    except SelectorError as exc:
        raise RequestError(where, str(exc)) from None


def _check_field_selector(where: str, text: str) -> None:
    if len(text) > MAX_SELECTOR_LENGTH:
        raise RequestError(where, f"longer than {MAX_SELECTOR_LENGTH} characters")
    try:
        parse_field_selector(text)
    except SelectorError as exc:
        raise RequestError(where, str(exc)) from None


def encode_request(request: WatchRequest) -> bytes:
    """Encode a request back to its JSON message (omitting defaults)."""
    return msgspec.json.encode(request)
