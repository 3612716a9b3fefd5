"""Wire formats of the Graph API: the client JSON (seed 002 "Response to client") and the kas<->agentk protobuf.

JSON messages are ``{"actions": [...], "warnings": [...]}`` (empty lists omitted) or ``{"error": {...}}``:

- vertex ``{"g", "v", "r", "ns", "n"}`` with ``ns`` omitted for cluster-scoped objects;
- ``svx`` ``{"vx", "o"?, "j"?}``: at most one of ``o`` / ``j``, none when empty;
- ``dvx`` ``{"vx"}``; ``sarc`` ``{"s", "d", "t", "a"?}`` with ``a`` holding only true flags and omitted when
  empty; ``darc`` ``{"s", "d", "t"}``;
- warning ``{"t", "m", "a"?}``; error ``{"code", "code_string", "reason"}``.

``o`` / ``j`` travel as already-encoded JSON bytes end to end (agentk encodes each object once, kas splices
the bytes into the message without decoding them).

Both hot conversions are written out by hand (issue 15: building protobuf messages field by field and JSON
through dicts cost about 20 us per action each, several times the rest of the per-object work):
:func:`encode_response` writes ``WatchGraphResponse`` bytes directly (proto3 encoding, fields in number
order, as the generated code does), and :func:`response_to_json` writes the client JSON from the parsed
response, encoding each distinct vertex of a message once. :func:`batch_to_json` builds the same JSON
through dicts; the tests hold the two to identical bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from tether.modules.graph.engine.model import (
    ATTR_BLOCK_OWNER_DELETION,
    ATTR_CONTROLLER,
    ATTR_DESTINATION_MISSING,
    Action,
    DeleteVertex,
    GraphWarning,
    SetArc,
    SetVertex,
    VertexId,
)
from tether.modules.graph.engine.request import (
    ExcludeQuery,
    IncludeQuery,
    Namespaces,
    ObjectQuery,
    Query,
    Roots,
    WatchRequest,
)
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2

__all__ = [
    "batch_to_json",
    "encode_response",
    "error_to_json",
    "request_from_proto",
    "request_to_proto",
    "response_to_json",
    "response_to_proto",
]

_ENCODER = msgspec.json.Encoder()
#: "None is set if both are empty (empty object/array)".
_EMPTY = (b"{}", b"[]")


# ---- JSON ----------------------------------------------------------------------------------------


def _vertex_json(vertex: VertexId) -> dict[str, str]:
    group, version, resource, namespace, name = vertex  # the graph's shared ids are plain tuples
    if namespace:
        return {"g": group, "v": version, "r": resource, "ns": namespace, "n": name}
    return {"g": group, "v": version, "r": resource, "n": name}


def _attrs_json(bits: int) -> dict[str, bool]:
    attrs: dict[str, bool] = {}
    if bits & ATTR_CONTROLLER:
        attrs["c"] = True
    if bits & ATTR_BLOCK_OWNER_DELETION:
        attrs["b"] = True
    if bits & ATTR_DESTINATION_MISSING:
        attrs["e"] = True
    return attrs


def _action_json(action: Action) -> dict[str, Any]:
    if isinstance(action, SetVertex):
        body: dict[str, Any] = {"vx": _vertex_json(action.vertex)}
        if action.object and action.object not in _EMPTY:
            body["o"] = msgspec.Raw(action.object)
        elif action.json_path and action.json_path not in _EMPTY:
            body["j"] = msgspec.Raw(action.json_path)
        return {"svx": body}
    if isinstance(action, DeleteVertex):
        return {"dvx": {"vx": _vertex_json(action.vertex)}}
    if isinstance(action, SetArc):
        arc: dict[str, Any] = {
            "s": _vertex_json(action.source),
            "d": _vertex_json(action.destination),
            "t": action.type,
        }
        attrs = _attrs_json(action.attributes)
        if attrs:
            arc["a"] = attrs
        return {"sarc": arc}
    return {"darc": {"s": _vertex_json(action.source), "d": _vertex_json(action.destination), "t": action.type}}


def _warning_json(warning: GraphWarning) -> dict[str, Any]:
    out: dict[str, Any] = {"t": warning.type, "m": warning.message}
    if warning.attributes:
        out["a"] = dict(warning.attributes)
    return out


def batch_to_json(actions: Sequence[Action], warnings: Sequence[GraphWarning] = ()) -> bytes:
    """Encode one client message from engine actions and warnings."""
    message: dict[str, Any] = {}
    if actions:
        message["actions"] = [_action_json(a) for a in actions]
    if warnings:
        message["warnings"] = [_warning_json(w) for w in warnings]
    return _ENCODER.encode(message)


def error_to_json(code: int, code_string: str, reason: str) -> bytes:
    """Encode ``{"error": {"code", "code_string", "reason"}}``."""
    return _ENCODER.encode({"error": {"code": code, "code_string": code_string, "reason": reason}})


# ---- protobuf (agentk -> kas) -------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [_varint(n) for n in range(128)]


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: ``tag`` (one byte, fields 1-15) + length + payload."""
    size = len(payload)
    return tag + (_SMALL_VARINTS[size] if size < 128 else _varint(size)) + payload


# Tags (field number << 3 | wire type 2) of the length-delimited fields used below.
_T1, _T2, _T3, _T4, _T5 = b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x2a"


def _vertex_pb_bytes(vertex: VertexId) -> bytes:
    out = b""
    for tag, value in zip((_T1, _T2, _T3, _T4, _T5), vertex, strict=True):
        if value:
            out += _field(tag, value.encode())
    return out


def _attributes_pb_bytes(bits: int) -> bytes:
    return (
        (b"\x08\x01" if bits & ATTR_CONTROLLER else b"")
        + (b"\x10\x01" if bits & ATTR_BLOCK_OWNER_DELETION else b"")
        + (b"\x18\x01" if bits & ATTR_DESTINATION_MISSING else b"")
    )


def encode_response(actions: Iterable[Action], warnings: Sequence[GraphWarning] = ()) -> bytes:
    """The serialized ``WatchGraphResponse`` for engine actions and warnings (agentk side).

    Equal to building the message with the generated classes and serializing it; each distinct vertex is
    encoded once per call.
    """
    vertices: dict[VertexId, bytes] = {}

    def vx(vertex: VertexId) -> bytes:
        encoded = vertices.get(vertex)
        if encoded is None:
            encoded = vertices[vertex] = _vertex_pb_bytes(vertex)
        return encoded

    parts: list[bytes] = []
    for action in actions:
        if isinstance(action, SetArc):
            body = (
                _field(_T1, vx(action.source))
                + _field(_T2, vx(action.destination))
                + (_field(_T3, action.type.encode()) if action.type else b"")
                + _field(_T4, _attributes_pb_bytes(action.attributes))
            )
            parts.append(_field(_T1, _field(_T3, body)))
        elif isinstance(action, SetVertex):
            body = _field(_T1, vx(action.vertex))
            if action.object:
                body += _field(_T2, action.object)
            if action.json_path:
                body += _field(_T3, action.json_path)
            parts.append(_field(_T1, _field(_T1, body)))
        elif isinstance(action, DeleteVertex):
            parts.append(_field(_T1, _field(_T2, _field(_T1, vx(action.vertex)))))
        else:
            body = (
                _field(_T1, vx(action.source))
                + _field(_T2, vx(action.destination))
                + (_field(_T3, action.type.encode()) if action.type else b"")
            )
            parts.append(_field(_T1, _field(_T4, body)))
    for w in warnings:
        encoded = rpc_pb2.Warning(type=w.type, message=w.message, attributes=dict(w.attributes)).SerializeToString()
        parts.append(_field(_T2, encoded))
    return b"".join(parts)


def response_to_proto(actions: Sequence[Action], warnings: Sequence[GraphWarning] = ()) -> rpc_pb2.WatchGraphResponse:
    """One ``WatchGraphResponse`` message from engine actions and warnings (see :func:`encode_response`)."""
    return rpc_pb2.WatchGraphResponse.FromString(encode_response(actions, warnings))


def response_to_json(response: rpc_pb2.WatchGraphResponse) -> bytes:
    """The client JSON message for one agent response (kas side), byte for byte what :func:`batch_to_json` gives.

    Raises:
        ValueError: an action sets no known variant (a newer or broken agent).
    """
    vertices: dict[tuple[str, str, str, str, str], bytes] = {}
    encode = _ENCODER.encode

    def vx(pb: rpc_pb2.Vertex) -> bytes:
        key = (pb.group, pb.version, pb.resource, pb.namespace, pb.name)
        encoded = vertices.get(key)
        if encoded is None:
            encoded = vertices[key] = encode(_vertex_json(VertexId(*key)))
        return encoded

    parts: list[bytes] = []
    for action in response.actions:
        variant = action.WhichOneof("action")
        if variant == "set_arc":
            sarc = action.set_arc
            attrs = sarc.attributes
            bits = (
                (ATTR_CONTROLLER if attrs.controller else 0)
                | (ATTR_BLOCK_OWNER_DELETION if attrs.block_owner_deletion else 0)
                | (ATTR_DESTINATION_MISSING if attrs.destination_missing else 0)
            )
            parts.append(
                b'{"sarc":{"s":'
                + vx(sarc.source)
                + b',"d":'
                + vx(sarc.destination)
                + b',"t":'
                + _json_string(sarc.type)
                + (b',"a":' + _ATTRS_JSON[bits] if bits else b"")
                + b"}}"
            )
        elif variant == "set_vertex":
            svx = action.set_vertex
            payload = b""
            if svx.object and svx.object not in _EMPTY:
                payload = b',"o":' + svx.object
            elif svx.json_path and svx.json_path not in _EMPTY:
                payload = b',"j":' + svx.json_path
            parts.append(b'{"svx":{"vx":' + vx(svx.vertex) + payload + b"}}")
        elif variant == "delete_vertex":
            parts.append(b'{"dvx":{"vx":' + vx(action.delete_vertex.vertex) + b"}}")
        elif variant == "delete_arc":
            darc = action.delete_arc
            parts.append(
                b'{"darc":{"s":'
                + vx(darc.source)
                + b',"d":'
                + vx(darc.destination)
                + b',"t":'
                + _json_string(darc.type)
                + b"}}"
            )
        else:
            raise ValueError("agent sent an action of an unknown kind")
    out = b"{"
    if parts:
        out += b'"actions":[' + b",".join(parts) + b"]"
    if response.warnings:
        warnings = [_warning_json(GraphWarning(w.type, w.message, dict(w.attributes))) for w in response.warnings]
        out += (b"," if parts else b"") + b'"warnings":' + encode(warnings)
    return out + b"}"


_ATTRS_JSON = [_ENCODER.encode(_attrs_json(bits)) for bits in range(8)]
_ARC_TYPES_JSON = {t: _ENCODER.encode(t) for t in ("or", "r", "t")}


def _json_string(value: str) -> bytes:
    encoded = _ARC_TYPES_JSON.get(value)
    return encoded if encoded is not None else _ENCODER.encode(value)


# ---- request conversion ------------------------------------------------------------------------


def request_to_proto(request: WatchRequest) -> rpc_pb2.WatchGraphRequest:
    """The protobuf form of a decoded request (kas -> agentk)."""
    out = rpc_pb2.WatchGraphRequest()
    for query in request.queries:
        pb = out.queries.add()
        if query.include is not None:
            pb.include.resource_selector_expression = query.include.resource_selector_expression
            if query.include.object is not None:
                obj = query.include.object
                pb.include.object.label_selector = obj.label_selector
                pb.include.object.field_selector = obj.field_selector
                pb.include.object.object_selector_expression = obj.object_selector_expression
                pb.include.object.json_path = obj.json_path
        elif query.exclude is not None:
            pb.exclude.resource_selector_expression = query.exclude.resource_selector_expression
    if request.namespaces is not None:
        ns = request.namespaces
        out.namespaces.names.extend(ns.names)
        out.namespaces.label_selector = ns.label_selector
        out.namespaces.field_selector = ns.field_selector
        out.namespaces.object_selector_expression = ns.object_selector_expression
    if request.roots is not None:
        out.roots.object_selector_expressions.extend(request.roots.object_selector_expressions)
        out.roots.ignore_arc_direction.extend(request.roots.ignore_arc_direction)
    return out


def request_from_proto(request: rpc_pb2.WatchGraphRequest) -> WatchRequest:
    """The decoded request from its protobuf form (agentk side; validate with ``compile_request``)."""
    queries: list[Query] = []
    for pb in request.queries:
        variant = pb.WhichOneof("query")
        if variant == "include":
            include = pb.include
            obj = (
                ObjectQuery(
                    label_selector=include.object.label_selector,
                    field_selector=include.object.field_selector,
                    object_selector_expression=include.object.object_selector_expression,
                    json_path=include.object.json_path,
                )
                if include.HasField("object")
                else None
            )
            queries.append(Query(include=IncludeQuery(include.resource_selector_expression, obj)))
        elif variant == "exclude":
            queries.append(Query(exclude=ExcludeQuery(pb.exclude.resource_selector_expression)))
        else:
            queries.append(Query())
    namespaces = (
        Namespaces(
            names=list(request.namespaces.names),
            label_selector=request.namespaces.label_selector,
            field_selector=request.namespaces.field_selector,
            object_selector_expression=request.namespaces.object_selector_expression,
        )
        if request.HasField("namespaces")
        else None
    )
    roots = (
        Roots(
            object_selector_expressions=list(request.roots.object_selector_expressions),
            ignore_arc_direction=list(request.roots.ignore_arc_direction),
        )
        if request.HasField("roots")
        else None
    )
    return WatchRequest(queries=queries, namespaces=namespaces, roots=roots)
