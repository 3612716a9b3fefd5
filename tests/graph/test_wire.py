"""The client JSON format (seed 002 "Response to client") and its trip through protobuf."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from tether.modules.graph.rpc.wire import (
    batch_to_json,
    encode_response,
    error_to_json,
    response_to_json,
    response_to_proto,
)
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2

POD = VertexId("", "v1", "pods", "myns", "pod1")
DEPLOYMENT = VertexId("apps", "v1", "deployments", "myns", "my_deployment")
NODE = VertexId("", "v1", "nodes", "", "node-1")

ACTIONS = [
    SetVertex(DEPLOYMENT, b'{"kind":"Deployment"}', None),
    SetVertex(POD, None, b'["a",1]'),
    SetVertex(NODE, None, None),
    SetArc(POD, DEPLOYMENT, "or", ATTR_CONTROLLER),
    SetArc(POD, NODE, "r", 0),
    SetArc(POD, DEPLOYMENT, "t", ATTR_CONTROLLER | ATTR_BLOCK_OWNER_DELETION | ATTR_DESTINATION_MISSING),
    DeleteArc(POD, DEPLOYMENT, "or"),
    DeleteVertex(DEPLOYMENT),
]
WARNINGS = [
    GraphWarning("INFORMER_SYNC_FAILED", "Failed to sync", {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns"}),
    GraphWarning("DISCOVERY_FAILED", "partial", {}),
]
EXPECTED = {
    "actions": [
        {
            "svx": {
                "vx": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"},
                "o": {"kind": "Deployment"},
            }
        },
        {"svx": {"vx": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"}, "j": ["a", 1]}},
        {"svx": {"vx": {"g": "", "v": "v1", "r": "nodes", "n": "node-1"}}},
        {
            "sarc": {
                "s": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"},
                "d": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"},
                "t": "or",
                "a": {"c": True},
            }
        },
        {
            "sarc": {
                "s": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"},
                "d": {"g": "", "v": "v1", "r": "nodes", "n": "node-1"},
                "t": "r",
            }
        },
        {
            "sarc": {
                "s": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"},
                "d": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"},
                "t": "t",
                "a": {"c": True, "b": True, "e": True},
            }
        },
        {
            "darc": {
                "s": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"},
                "d": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"},
                "t": "or",
            }
        },
        {"dvx": {"vx": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"}}},
    ],
    "warnings": [
        {
            "t": "INFORMER_SYNC_FAILED",
            "m": "Failed to sync",
            "a": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns"},
        },
        {"t": "DISCOVERY_FAILED", "m": "partial"},
    ],
}


def test_json_format() -> None:
    assert json.loads(batch_to_json(ACTIONS, WARNINGS)) == EXPECTED


def test_through_protobuf_is_identical() -> None:
    response = rpc_pb2.WatchGraphResponse.FromString(response_to_proto(ACTIONS, WARNINGS).SerializeToString())
    assert json.loads(response_to_json(response)) == EXPECTED  # map order of "a" may differ


def test_empty_projections_and_lists_are_omitted() -> None:
    assert json.loads(batch_to_json([SetVertex(POD, b"{}", b"[]")])) == {
        "actions": [{"svx": {"vx": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"}}}]
    }
    assert json.loads(batch_to_json([], WARNINGS[1:])) == {"warnings": [{"t": "DISCOVERY_FAILED", "m": "partial"}]}


def test_error_message() -> None:
    assert json.loads(error_to_json(1007, "StatusInvalidFramePayloadData", "bad")) == {
        "error": {"code": 1007, "code_string": "StatusInvalidFramePayloadData", "reason": "bad"}
    }


def test_unknown_action_from_agent_is_rejected() -> None:
    response = rpc_pb2.WatchGraphResponse(actions=[rpc_pb2.Action()])
    with pytest.raises(ValueError):
        response_to_json(response)


_names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_vertices = st.builds(VertexId, _names, _names, _names, _names, _names)
_payloads = st.none() | st.sampled_from(
    [b"{}", b"[]", b'{"k":"\\u00e9"}', b'["x",1]', b'{"big":"' + b"a" * 300 + b'"}']
)
_actions = st.lists(
    st.one_of(
        st.builds(SetVertex, _vertices, _payloads, _payloads),
        st.builds(DeleteVertex, _vertices),
        st.builds(SetArc, _vertices, _vertices, st.sampled_from(["or", "r", "t", 'x"y']), st.integers(0, 7)),
        st.builds(DeleteArc, _vertices, _vertices, st.sampled_from(["or", "r", "t"])),
    ),
    max_size=20,
)
_warnings = st.lists(st.builds(GraphWarning, _names, _names, st.dictionaries(_names, _names, max_size=1)), max_size=3)


@settings(max_examples=300)
@given(_actions, _warnings)
def test_hand_written_encodings_match_the_generated_code_and_the_dict_path(
    actions: list[Action], warnings: list[GraphWarning]
) -> None:
    generated = rpc_pb2.WatchGraphResponse(
        actions=[_generated_action(a) for a in actions],
        warnings=[rpc_pb2.Warning(type=w.type, message=w.message, attributes=w.attributes) for w in warnings],
    )
    encoded = encode_response(actions, warnings)
    assert rpc_pb2.WatchGraphResponse.FromString(encoded) == generated
    if all(len(w.attributes) <= 1 for w in warnings):  # map order is not defined for more
        assert encoded == generated.SerializeToString()
    assert response_to_json(rpc_pb2.WatchGraphResponse.FromString(encoded)) == batch_to_json(actions, warnings)


def _generated_vertex(vertex: VertexId) -> rpc_pb2.Vertex:
    return rpc_pb2.Vertex(
        group=vertex.group,
        version=vertex.version,
        resource=vertex.resource,
        namespace=vertex.namespace,
        name=vertex.name,
    )


def _generated_action(action: Action) -> rpc_pb2.Action:
    if isinstance(action, SetVertex):
        return rpc_pb2.Action(
            set_vertex=rpc_pb2.SetVertex(
                vertex=_generated_vertex(action.vertex), object=action.object or b"", json_path=action.json_path or b""
            )
        )
    if isinstance(action, DeleteVertex):
        return rpc_pb2.Action(delete_vertex=rpc_pb2.DeleteVertex(vertex=_generated_vertex(action.vertex)))
    if isinstance(action, SetArc):
        bits = action.attributes
        return rpc_pb2.Action(
            set_arc=rpc_pb2.SetArc(
                source=_generated_vertex(action.source),
                destination=_generated_vertex(action.destination),
                type=action.type,
                attributes=rpc_pb2.ArcAttributes(
                    controller=bool(bits & ATTR_CONTROLLER),
                    block_owner_deletion=bool(bits & ATTR_BLOCK_OWNER_DELETION),
                    destination_missing=bool(bits & ATTR_DESTINATION_MISSING),
                ),
            )
        )
    return rpc_pb2.Action(
        delete_arc=rpc_pb2.DeleteArc(
            source=_generated_vertex(action.source), destination=_generated_vertex(action.destination), type=action.type
        )
    )
