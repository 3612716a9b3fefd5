"""The client JSON format (seed 002 "Response to client") and its trip through protobuf."""

from __future__ import annotations

import json

import pytest

from tether.modules.graph.engine.model import (
    ATTR_BLOCK_OWNER_DELETION,
    ATTR_CONTROLLER,
    ATTR_DESTINATION_MISSING,
    DeleteArc,
    DeleteVertex,
    GraphWarning,
    SetArc,
    SetVertex,
    VertexId,
)
from tether.modules.graph.rpc.wire import batch_to_json, error_to_json, response_to_json, response_to_proto
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
