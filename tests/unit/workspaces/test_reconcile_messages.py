"""The typed reconcile messages write and read the JSON of reference §1.3-§1.4 byte for byte."""

from __future__ import annotations

import json

import msgspec
import pytest

from tether.modules.remote_development.hub.params import parse
from tether.modules.remote_development.protocol import (
    ErrorDetails,
    ImagePullSecret,
    PodFailure,
    ReconcileRequest,
    ReconcileResponse,
    ReconcileSettings,
    WorkspaceAgentInfo,
    WorkspaceRailInfo,
)
from tether.modules.remote_development.states import State

DEPLOYMENT = {"metadata": {"name": "ws", "namespace": "ns", "resourceVersion": "7"}, "status": {}}


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def test_a_request_is_written_in_agentks_field_order_and_omits_what_is_unknown() -> None:
    full = WorkspaceAgentInfo("ws", "ns", latest_k8s_deployment_info=DEPLOYMENT)
    full.pod_failure = PodFailure("Unschedulable", "unbound claims", False)
    full.termination_progress = State.TERMINATING
    full.error_details = ErrorDetails("applier", "boom")
    request = ReconcileRequest("partial", [full, WorkspaceAgentInfo("gone", "ns2")])
    assert msgspec.json.encode(request) == _compact(
        {
            "update_type": "partial",
            "workspace_agent_infos": [
                {
                    "name": "ws",
                    "namespace": "ns",
                    "latest_k8s_deployment_info": DEPLOYMENT,
                    "pod_failure": {"reason": "Unschedulable", "message": "unbound claims", "lasting": False},
                    "termination_progress": "Terminating",
                    "error_details": {"error_type": "applier", "error_message": "boom"},
                },
                {"name": "gone", "namespace": "ns2"},
            ],
        }
    )


def test_the_hub_reads_what_agentk_writes() -> None:
    info = WorkspaceAgentInfo("ws", "ns", latest_k8s_deployment_info=DEPLOYMENT)
    info.error_details = ErrorDetails("applier", "boom")
    params = parse(msgspec.json.decode(msgspec.json.encode(ReconcileRequest("full", [info]))))
    [read] = params.infos
    assert (params.update_type, read.name, read.resource_version, read.error_message) == ("full", "ws", "7", "boom")


def test_a_response_is_written_as_upstreams_payload() -> None:
    response = ReconcileResponse(
        [
            WorkspaceRailInfo(
                name="ws",
                namespace="ns",
                desired_state=State.RUNNING,
                actual_state=State.STARTING,
                deployment_resource_version=None,
                config_to_apply="---\n{}\n",
                image_pull_secrets=[ImagePullSecret("registry", "default")],
            )
        ],
        ReconcileSettings(3600, 10),
    )
    expected = {
        "workspace_rails_infos": [
            {
                "name": "ws",
                "namespace": "ns",
                "desired_state": "Running",
                "actual_state": "Starting",
                "deployment_resource_version": None,
                "config_to_apply": "---\n{}\n",
                "image_pull_secrets": [{"name": "registry", "namespace": "default"}],
            }
        ],
        "settings": {"full_reconciliation_interval_seconds": 3600, "partial_reconciliation_interval_seconds": 10},
    }
    encoded = msgspec.json.encode(response)
    assert encoded == _compact(expected)
    assert msgspec.json.decode(encoded, type=ReconcileResponse) == response


def test_agentk_reads_an_answer_with_fields_it_does_not_know_or_misses() -> None:
    answer = b'{"workspace_rails_infos":[{"name":"ws","namespace":"ns","desired_state":"Running","new":1}],"x":{}}'
    decoded = msgspec.json.decode(answer, type=ReconcileResponse)
    [info] = decoded.workspace_rails_infos
    assert (info.name, info.desired_state, info.deployment_resource_version, info.config_to_apply) == (
        "ws",
        "Running",
        None,
        "",
    )
    assert decoded.settings == ReconcileSettings()


def test_agentk_refuses_an_answer_of_the_wrong_shape() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"workspace_rails_infos": {"name": "ws"}}', type=ReconcileResponse)
