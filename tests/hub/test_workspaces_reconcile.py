"""The reconcile endpoint (reference §1-§4) driven as agentk would, through a real hub on each backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures.hub import RealHub
from tests.hub.workspace_helpers import (
    LIST,
    UPDATE,
    WorkspaceSetup,
    create,
    deployment,
    graphql,
    info,
    reconcile,
    workspace_setup,
)

PREFIX = "Workspace reconcile params validation failed: "


def rails_infos(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"workspace_rails_infos", "settings"}
    return list(body["workspace_rails_infos"])


def kinds(config: str) -> list[str]:
    return [f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(config)]


def set_state(hub: RealHub, ws: WorkspaceSetup, gid: str, state: str) -> None:
    payload = graphql(hub, ws.setup.tokens["developer"], UPDATE, {"id": gid, "state": state}).json()
    assert payload["data"]["workspaceUpdate"]["errors"] == [], payload


def test_lifecycle_through_reconcile(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    name, namespace = created["name"], created["namespace"]

    # First full sync: agentk knows nothing; the hub sends the new workspace with every resource.
    full = reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []})
    assert full.json()["settings"] == {
        "full_reconciliation_interval_seconds": 60,
        "partial_reconciliation_interval_seconds": 1,
    }
    [first] = rails_infos(full)
    assert first["desired_state"] == "Running" and first["actual_state"] == "CreationRequested"
    assert first["deployment_resource_version"] is None and first["image_pull_secrets"] == []
    assert kinds(first["config_to_apply"]) == [
        f"ConfigMap/{name}-workspace-inventory",
        f"Deployment/{name}",
        f"Service/{name}",
        f"PersistentVolumeClaim/{name}-gl-workspace-data",
        f"ServiceAccount/{name}",
        f"NetworkPolicy/{name}",
        f"ConfigMap/{name}-secrets-inventory",
        f"Secret/{name}-env-var",
        f"Secret/{name}-file",
    ]
    row = hub.db.rows("SELECT force_include_all_resources, responded_to_agent_at FROM workspaces")[0]
    assert not row["force_include_all_resources"] and row["responded_to_agent_at"] is not None

    # Nothing changed: a partial sync returns nothing.
    assert rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": []})) == []

    def report(rv: str, replicas: int, available: int, progress: str) -> dict[str, Any]:
        d = deployment(name, namespace, rv, replicas, available, progress)
        [answer] = rails_infos(
            reconcile(
                hub,
                ws,
                {
                    "update_type": "partial",
                    "workspace_agent_infos": [info(name, namespace, latest_k8s_deployment_info=d)],
                },
            )
        )
        assert answer["deployment_resource_version"] == rv
        return answer

    starting = report("10", 1, 0, "NewReplicaSetCreated")
    assert starting["actual_state"] == "Starting" and starting["config_to_apply"]  # actual changed: all resources
    again = report("10", 1, 0, "NewReplicaSetCreated")
    assert again["actual_state"] == "Starting" and again["config_to_apply"] == ""  # acknowledgement only
    assert report("11", 1, 1, "NewReplicaSetAvailable")["actual_state"] == "Running"

    # Restart: replicas 0 until Stopped is reported, then desired flips to Running in the same request.
    set_state(hub, ws, created["id"], "RestartRequested")
    [restart] = rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": []}))
    assert restart["desired_state"] == "RestartRequested"
    docs = list(yaml.safe_load_all(restart["config_to_apply"]))
    assert next(d for d in docs if d["kind"] == "Deployment")["spec"]["replicas"] == 0
    assert "Secret" not in {d["kind"] for d in docs}  # desired changed only: partial set
    stopped = report("12", 0, 0, "NewReplicaSetAvailable")
    assert stopped["actual_state"] == "Stopped" and stopped["desired_state"] == "Running"
    docs = list(yaml.safe_load_all(stopped["config_to_apply"]))
    assert next(d for d in docs if d["kind"] == "Deployment")["spec"]["replicas"] == 1

    # Terminate: only the two inventories, until agentk reports Terminated.
    set_state(hub, ws, created["id"], "Terminated")
    [term] = rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": []}))
    assert kinds(term["config_to_apply"]) == [
        f"ConfigMap/{name}-workspace-inventory",
        f"ConfigMap/{name}-secrets-inventory",
    ]
    for progress in ("Terminating", "Terminated"):
        [answer] = rails_infos(
            reconcile(
                hub,
                ws,
                {
                    "update_type": "partial",
                    "workspace_agent_infos": [info(name, namespace, termination_progress=progress)],
                },
            )
        )
        assert answer["actual_state"] == progress
    assert rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []})) == []


def test_error_details_and_failure_reasons_reach_the_user(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    name, namespace = created["name"], created["namespace"]
    rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}))
    error = {"error_type": "applier", "error_message": 'Deployment "x" is invalid: spec.template: bad'}
    [answer] = rails_infos(
        reconcile(
            hub, ws, {"update_type": "partial", "workspace_agent_infos": [info(name, namespace, error_details=error)]}
        )
    )
    assert answer["actual_state"] == "Error"
    node = graphql(hub, ws.setup.tokens["developer"], LIST).json()["data"]["workspaces"]["nodes"][0]
    assert node["actualState"] == "Error" and "is invalid" in node["actualStateMessage"]

    crash = deployment(name, namespace, "5", 1, 0, "NewReplicaSetAvailable")
    failure = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope"'}
    [answer] = rails_infos(
        reconcile(
            hub,
            ws,
            {
                "update_type": "partial",
                "workspace_agent_infos": [info(name, namespace, latest_k8s_deployment_info=crash, pod_failure=failure)],
            },
        )
    )
    assert answer["actual_state"] == "Failed"
    node = graphql(hub, ws.setup.tokens["developer"], LIST).json()["data"]["workspaces"]["nodes"][0]
    assert node["actualStateMessage"] == 'ImagePullBackOff: Back-off pulling image "nope"'


def partial(hub: RealHub, ws: WorkspaceSetup, *infos: dict[str, Any]) -> list[dict[str, Any]]:
    return rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": list(infos)}))


def test_an_error_workspace_is_retried_at_every_partial_until_its_cause_is_fixed(hub: RealHub) -> None:
    """Issue 23 item 4: an Error workspace returns to its desired state within one partial reconciliation.

    Upstream sends it once and then only at the hourly full update. Here, while it is Error, every partial
    answer carries all its resources and no resource version (agentk applies again and re-reports its
    Deployment); objects refused as invalid are not retried and the reason says what the user must do.
    """
    ws = workspace_setup(hub)
    created = create(hub, ws)
    name, namespace = created["name"], created["namespace"]
    rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}))
    quota = 'deployments.apps "x" is forbidden: exceeded quota: q, requested: count/deployments.apps=1'
    [answer] = partial(hub, ws, info(name, namespace, error_details={"error_type": "applier", "error_message": quota}))
    assert answer["actual_state"] == "Error" and answer["deployment_resource_version"] is None
    node = graphql(hub, ws.setup.tokens["developer"], LIST).json()["data"]["workspaces"]["nodes"][0]
    assert node["actualStateMessage"].startswith(quota)
    assert "agentk applies the workspace again at every partial reconciliation" in node["actualStateMessage"]
    for _ in range(2):  # agentk has nothing new to say: the hub still sends everything again
        [again] = partial(hub, ws)
        assert f"Deployment/{name}" in kinds(again["config_to_apply"]), again
        assert again["deployment_resource_version"] is None
    # The quota is gone, the apply went through: agentk reports the Deployment, the workspace leaves Error.
    [running] = partial(
        hub,
        ws,
        info(
            name, namespace, latest_k8s_deployment_info=deployment(name, namespace, "7", 1, 1, "NewReplicaSetAvailable")
        ),
    )
    assert running["actual_state"] == "Running" and running["deployment_resource_version"] == "7"
    assert partial(hub, ws) == []

    invalid = 'Deployment.apps "x" is invalid: spec.template.spec.containers[0].ports[0].name: Invalid value'
    [refused] = partial(
        hub, ws, info(name, namespace, error_details={"error_type": "applier", "error_message": invalid})
    )
    assert refused["actual_state"] == "Error"
    node = graphql(hub, ws.setup.tokens["developer"], LIST).json()["data"]["workspaces"]["nodes"][0]
    assert "terminate this workspace and create a new one with a corrected devfile" in node["actualStateMessage"]
    assert partial(hub, ws) == []  # no retry changes an invalid object


def test_orphans_and_other_agents_workspaces_are_ignored(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    other = hub.api().post(f"/projects/{ws.setup.project_id}/cluster_agents", json={"name": "other"}).json()
    token = hub.api().post(f"/projects/{ws.setup.project_id}/cluster_agents/{other['id']}/tokens", json={"name": "t"})
    before = hub.db.rows("SELECT actual_state, responded_to_agent_at FROM workspaces")
    body = {
        "update_type": "partial",
        "workspace_agent_infos": [info(created["name"], created["namespace"], termination_progress="Terminated")],
    }
    assert rails_infos(reconcile(hub, ws, body, token=token.json()["token"])) == []
    assert hub.db.rows("SELECT actual_state, responded_to_agent_at FROM workspaces") == before
    assert "orphaned workspace" in hub.log.text


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({}, 400, PREFIX + "root is missing required keys: update_type, workspace_agent_infos"),
        (
            {"update_type": "sideways", "workspace_agent_infos": []},
            400,
            PREFIX + 'property \'/update_type\' is not one of: ["partial", "full"]',
        ),
        (
            {"update_type": "full", "workspace_agent_infos": [{"name": "x"}]},
            400,
            PREFIX + "property '/workspace_agent_infos/0' is missing required keys: namespace",
        ),
        (
            {
                "update_type": "full",
                "workspace_agent_infos": [{"name": "x", "namespace": "y", "termination_progress": "Gone"}],
            },
            400,
            None,
        ),
        (
            {
                "update_type": "full",
                "workspace_agent_infos": [{"name": "x", "namespace": "y", "error_details": {"error_type": "bad"}}],
            },
            400,
            None,
        ),
    ],
)
def test_bad_bodies_get_clear_errors_and_change_nothing(
    hub: RealHub, body: Any, status: int, message: str | None
) -> None:
    ws = workspace_setup(hub)
    create(hub, ws)
    before = hub.db.snapshot(ignore=("cluster_agent_tokens.last_used_at",))
    response = reconcile(hub, ws, body)
    assert response.status_code == status
    error = response.json()["message"]["error"]
    assert error.startswith(PREFIX)
    if message is not None:
        assert error == message
    assert hub.db.snapshot(ignore=("cluster_agent_tokens.last_used_at",)) == before


def test_malformed_json_and_authentication(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    create(hub, ws)
    url = hub.api_url + "/internal/kubernetes/modules/remote_development/reconcile"
    before = hub.db.snapshot(ignore=("cluster_agent_tokens.last_used_at",))
    headers = {**hub.kas_headers(), "Gitlab-Agent-Api-Request": ws.agent_token}
    bad_json = httpx.post(url, content=b"{not json", headers={**headers, "Content-Type": "application/json"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["message"]["error"]
    body = {"update_type": "full", "workspace_agent_infos": []}
    assert httpx.post(url, json=body, headers={"Gitlab-Agent-Api-Request": ws.agent_token}).status_code == 401
    wrong = httpx.post(url, json=body, headers={**hub.kas_headers(), "Gitlab-Agent-Api-Request": "nope"})
    assert wrong.status_code == 401
    assert hub.db.snapshot(ignore=("cluster_agent_tokens.last_used_at",)) == before


def test_lifecycle_rules_and_disabled_agent(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    name, namespace = created["name"], created["namespace"]
    rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}))
    long_ago = datetime.now(UTC) - timedelta(hours=37)
    hub.db.execute(
        "UPDATE workspaces SET desired_state_updated_at = :t",
        t=long_ago if "postgres" in hub.config.database_url else long_ago.replace(tzinfo=None),
    )
    running = deployment(name, namespace, "3", 1, 1, "NewReplicaSetAvailable")
    [answer] = rails_infos(
        reconcile(
            hub,
            ws,
            {
                "update_type": "full",
                "workspace_agent_infos": [info(name, namespace, latest_k8s_deployment_info=running)],
            },
        )
    )
    assert answer["desired_state"] == "Stopped"  # active longer than max_active_hours_before_stop (36)

    set_state(hub, ws, created["id"], "Running")
    rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}))
    configuration = f"/projects/{ws.setup.project_id}/cluster_agents/{ws.setup.agent_id}/configuration"

    # Another setting edited, the section left out (issue 27 item 7): nothing changes, as in GitLab.
    hub.api().put(configuration, content=b"observability: {logging: {level: debug}}\n").raise_for_status()
    [answer] = rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}))
    assert answer["desired_state"] == "Running"
    assert rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": []})) == []

    # Switched off explicitly: stopped, never terminated; the owner may still terminate it.
    hub.api().put(configuration, content=b"remote_development: {enabled: false}\n").raise_for_status()
    [answer] = rails_infos(reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}))
    assert answer["desired_state"] == "Stopped"
    assert f"PersistentVolumeClaim/{name}-gl-workspace-data" in kinds(answer["config_to_apply"])
    set_state(hub, ws, created["id"], "Running")
    [answer] = rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": []}))
    assert answer["desired_state"] == "Stopped"
    set_state(hub, ws, created["id"], "Terminated")
    [answer] = rails_infos(reconcile(hub, ws, {"update_type": "partial", "workspace_agent_infos": []}))
    assert answer["desired_state"] == "Terminated"
