"""Reconcile body validation with upstream's exact messages (vectors §V8) and Tether's stricter checks."""

from __future__ import annotations

from typing import Any

import pytest

from tether.modules.remote_development.hub.params import ERROR_PREFIX, ParamsError, parse, validate

INFO: dict[str, Any] = {"termination_progress": "Terminated", "error_details": None}


@pytest.mark.parametrize(
    "body",
    [
        {"update_type": "full", "workspace_agent_infos": []},
        {"update_type": "partial", "workspace_agent_infos": [INFO]},
        {
            "update_type": "partial",
            "workspace_agent_infos": [
                {**INFO, "error_details": {"error_type": "applier", "error_message": "something has gone wrong"}}
            ],
        },
        {
            "update_type": "partial",
            "workspace_agent_infos": [
                {**INFO, "error_details": {"error_type": "kubernetes", "error_message": "something has gone wrong"}}
            ],
        },
        {"update_type": "full", "workspace_agent_infos": [], "extra": "unknown keys are accepted"},
    ],
)
def test_valid(body: dict[str, Any]) -> None:
    validate(body)


def partial(info: dict[str, Any]) -> dict[str, Any]:
    return {"update_type": "partial", "workspace_agent_infos": [info]}


@pytest.mark.parametrize(
    ("body", "details"),
    [
        ({}, "root is missing required keys: update_type, workspace_agent_infos"),
        (
            {"update_type": "full", "workspace_agent_infos": "NOT AN ARRAY"},
            "property '/workspace_agent_infos' is not of type: array",
        ),
        (
            {"update_type": "INVALID UPDATE TYPE", "workspace_agent_infos": []},
            'property \'/update_type\' is not one of: ["partial", "full"]',
        ),
        (
            partial({**INFO, "error_details": {"error_message": "something has gone wrong"}}),
            "property '/workspace_agent_infos/0/error_details' is missing required keys: error_type",
        ),
        (
            partial({**INFO, "error_details": {"error_type": "INVALID ERROR TYPE"}}),
            'property \'/workspace_agent_infos/0/error_details/error_type\' is not one of: ["applier", "kubernetes"]',
        ),
        (
            partial({"termination_progress": "invalidValue"}),
            'property \'/workspace_agent_infos/0/termination_progress\' is not one of: ["Terminating", "Terminated"]',
        ),
    ],
)
def test_invalid_exact_details(body: dict[str, Any], details: str) -> None:
    with pytest.raises(ParamsError) as caught:
        validate(body)
    assert str(caught.value) == ERROR_PREFIX + details


def test_several_problems_joined() -> None:
    with pytest.raises(ParamsError) as caught:
        validate({"update_type": "x"})
    assert str(caught.value) == (
        ERROR_PREFIX + "root is missing required keys: workspace_agent_infos. "
        'property \'/update_type\' is not one of: ["partial", "full"]'
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "root is not of type: object"),
        (partial({"name": "a"}), "missing required keys: namespace"),
        (partial({"namespace": "a"}), "missing required keys: name"),
        (partial({"name": "", "namespace": "n"}), "/name' is empty"),
        (partial({"name": 5, "namespace": "n"}), "/name' is not of type: string"),
        (partial({"name": "a", "namespace": "n", "latest_k8s_deployment_info": "x"}), "is not of type: object"),
        (
            {"update_type": "full", "workspace_agent_infos": [{"name": "a", "namespace": "n"}] * 2},
            "repeats 'a'",
        ),
    ],
)
def test_tether_rejects_what_upstream_answers_with_500(body: Any, fragment: str) -> None:
    with pytest.raises(ParamsError) as caught:
        parse(body)
    assert fragment in str(caught.value)


def test_parse_reads_resource_version_and_null_namespace() -> None:
    params = parse(
        partial({"name": "w", "namespace": None, "latest_k8s_deployment_info": {"metadata": {"resourceVersion": "7"}}})
    )
    assert params.infos[0].namespace is None and params.infos[0].resource_version == "7"
    assert parse(partial({"name": "w", "namespace": "n"})).infos[0].resource_version is None
