"""Wire formats of the Graph API: the client JSON (seed 002 "Response to client") and the kas<->agentk protobuf.

JSON messages are ``{"actions": [...], "warnings": [...]}`` (empty lists omitted) or ``{"error": {...}}``:

- vertex ``{"g", "v", "r", "ns", "n"}`` with ``ns`` omitted for cluster-scoped objects;
- ``svx`` ``{"vx", "o"?, "j"?}``: at most one of ``o`` / ``j``, none when empty;
- ``dvx`` ``{"vx"}``; ``sarc`` ``{"s", "d", "t", "a"?}`` with ``a`` holding only true flags and omitted when
  empty; ``darc`` ``{"s", "d", "t"}``;
- warning ``{"t", "m", "a"?}``; error ``{"code", "code_string", "reason"}``.

``o`` / ``j`` travel as already-encoded JSON bytes end to end (agentk encodes each object once, kas splices
the bytes into the message without decoding them).
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
    DeleteArc,
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
    "actions_to_proto",
    "batch_to_json",
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
    if vertex.namespace:
        return {"g": vertex.group, "v": vertex.version, "r": vertex.resource, "ns": vertex.namespace, "n": vertex.name}
    return {"g": vertex.group, "v": vertex.version, "r": vertex.resource, "n": vertex.name}


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


def _vertex_pb(vertex: VertexId) -> rpc_pb2.Vertex:
    return rpc_pb2.Vertex(
        group=vertex.group,
        version=vertex.version,
        resource=vertex.resource,
        namespace=vertex.namespace,
        name=vertex.name,
    )


def actions_to_proto(actions: Iterable[Action]) -> list[rpc_pb2.Action]:
    """Convert engine actions to protobuf actions."""
    out: list[rpc_pb2.Action] = []
    for action in actions:
        if isinstance(action, SetVertex):
            out.append(
                rpc_pb2.Action(
                    set_vertex=rpc_pb2.SetVertex(
                        vertex=_vertex_pb(action.vertex), object=action.object or b"", json_path=action.json_path or b""
                    )
                )
            )
        elif isinstance(action, DeleteVertex):
            out.append(rpc_pb2.Action(delete_vertex=rpc_pb2.DeleteVertex(vertex=_vertex_pb(action.vertex))))
        elif isinstance(action, SetArc):
            bits = action.attributes
            out.append(
                rpc_pb2.Action(
                    set_arc=rpc_pb2.SetArc(
                        source=_vertex_pb(action.source),
                        destination=_vertex_pb(action.destination),
                        type=action.type,
                        attributes=rpc_pb2.ArcAttributes(
                            controller=bool(bits & ATTR_CONTROLLER),
                            block_owner_deletion=bool(bits & ATTR_BLOCK_OWNER_DELETION),
                            destination_missing=bool(bits & ATTR_DESTINATION_MISSING),
                        ),
                    )
                )
            )
        else:
            out.append(
                rpc_pb2.Action(
                    delete_arc=rpc_pb2.DeleteArc(
                        source=_vertex_pb(action.source), destination=_vertex_pb(action.destination), type=action.type
                    )
                )
            )
    return out


def response_to_proto(actions: Sequence[Action], warnings: Sequence[GraphWarning] = ()) -> rpc_pb2.WatchGraphResponse:
    """One ``WatchGraphResponse`` from engine actions and warnings."""
    return rpc_pb2.WatchGraphResponse(
        actions=actions_to_proto(actions),
        warnings=[rpc_pb2.Warning(type=w.type, message=w.message, attributes=dict(w.attributes)) for w in warnings],
    )


def _vertex_from_pb(vertex: rpc_pb2.Vertex) -> VertexId:
    return VertexId(vertex.group, vertex.version, vertex.resource, vertex.namespace, vertex.name)


def response_to_json(response: rpc_pb2.WatchGraphResponse) -> bytes:
    """The client JSON message for one agent response (kas side).

    Raises:
        ValueError: an action sets no known variant (a newer or broken agent).
    """
    actions: list[Action] = []
    for action in response.actions:
        variant = action.WhichOneof("action")
        if variant == "set_vertex":
            svx = action.set_vertex
            actions.append(SetVertex(_vertex_from_pb(svx.vertex), svx.object or None, svx.json_path or None))
        elif variant == "delete_vertex":
            actions.append(DeleteVertex(_vertex_from_pb(action.delete_vertex.vertex)))
        elif variant == "set_arc":
            sarc = action.set_arc
            attrs = sarc.attributes
            bits = (
                (ATTR_CONTROLLER if attrs.controller else 0)
                | (ATTR_BLOCK_OWNER_DELETION if attrs.block_owner_deletion else 0)
                | (ATTR_DESTINATION_MISSING if attrs.destination_missing else 0)
            )
            actions.append(SetArc(_vertex_from_pb(sarc.source), _vertex_from_pb(sarc.destination), sarc.type, bits))
        elif variant == "delete_arc":
            darc = action.delete_arc
            actions.append(DeleteArc(_vertex_from_pb(darc.source), _vertex_from_pb(darc.destination), darc.type))
        else:
            raise ValueError("agent sent an action of an unknown kind")
    warnings = [GraphWarning(w.type, w.message, dict(w.attributes)) for w in response.warnings]
    return batch_to_json(actions, warnings)


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
