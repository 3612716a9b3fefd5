"""Workspaces through the GraphQL API: who may create, see and change them; bad input changes nothing."""

from __future__ import annotations

import pytest

from tests.fixtures.hub import RealHub
from tests.hub.workspace_helpers import CREATE, LIST, UPDATE, create, graphql, workspace_setup

NO_ACCESS = "does not exist or you don't have permission"


def test_developer_creates_owner_sees_and_changes_state(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    assert created["desiredState"] == "Running" and created["actualState"] == "CreationRequested"
    assert created["name"].startswith(f"workspace-{ws.setup.agent_id}-{ws.setup.user_ids['developer']}-")
    assert created["namespace"].startswith("gl-rd-ns-")
    # The devfile serves 8080 and gets no editor: the URL names the port it serves.
    assert created["url"].startswith(f"https://8080-{created['name']}.workspaces.example.com/?folder=")
    assert created["clusterAgent"]["name"] == "production" and created["user"]["username"] == "developer"
    mine = graphql(hub, ws.setup.tokens["developer"], LIST).json()["data"]["workspaces"]
    assert [n["id"] for n in mine["nodes"]] == [created["id"]]
    for state in ("Stopped", "Running", "RestartRequested", "Terminated"):
        payload = graphql(hub, ws.setup.tokens["developer"], UPDATE, {"id": created["id"], "state": state}).json()
        assert payload["data"]["workspaceUpdate"]["errors"] == []
        assert payload["data"]["workspaceUpdate"]["workspace"]["desiredState"] == state
    final = graphql(hub, ws.setup.tokens["developer"], UPDATE, {"id": created["id"], "state": "Running"}).json()
    assert final["data"]["workspaceUpdate"]["errors"] == [
        "desiredState: is 'Terminated', and cannot be updated. Create a new workspace instead."
    ]


@pytest.mark.parametrize("role", ["guest", "reporter", "outsider"])
def test_below_developer_may_not_create(hub: RealHub, role: str) -> None:
    ws = workspace_setup(hub)
    before = hub.db.rows("SELECT count(*) AS n FROM workspaces")
    response = graphql(hub, ws.setup.tokens[role], CREATE, {"input": ws.create_input()})
    body = response.json()
    assert body["data"] is None and NO_ACCESS in body["errors"][0]["message"]
    assert hub.db.rows("SELECT count(*) AS n FROM workspaces") == before


def test_someone_elses_workspace_is_invisible_and_unchangeable(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    for role in ("maintainer", "guest", "outsider"):
        token = ws.setup.tokens[role]
        assert graphql(hub, token, LIST).json()["data"]["workspaces"]["nodes"] == []
        one = graphql(hub, token, "query($id: ID!) { workspace(id: $id) { id } }", {"id": created["id"]}).json()
        assert one["data"]["workspace"] is None
        changed = graphql(hub, token, UPDATE, {"id": created["id"], "state": "Terminated"}).json()
        assert NO_ACCESS in changed["errors"][0]["message"]
    row = hub.db.rows("SELECT desired_state FROM workspaces")
    assert row == [{"desired_state": "Running"}]
    # An administrator sees every workspace.
    admin = graphql(hub, hub.admin_token, LIST).json()["data"]["workspaces"]
    assert [n["id"] for n in admin["nodes"]] == [created["id"]]


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (
            {"devfile": "schemaVersion: 2.2.0\ncomponents: [{name: a, container: {image: x, colour: red}}]\n"},
            "devfile.components[0].container.colour: unknown field",
        ),
        ({"devfile": "schemaVersion: 2.2.0\n"}, "devfile.components: must be a non-empty list"),
        ({"name": "Not_A_Label"}, "name: 'Not_A_Label' is not a DNS label"),
        ({"name": "x" * 64}, "is not a DNS label"),
        ({"desiredState": "Sleeping"}, "desiredState: desired state 'Sleeping' is not one of"),
        ({"desiredState": "Terminated"}, "desiredState: must be Running or Stopped for a new workspace"),
        ({"clusterAgentId": "gid://gitlab/Clusters::Agent/abc"}, "clusterAgentId: "),
    ],
)
def test_bad_input_is_refused_with_the_field_and_creates_nothing(
    hub: RealHub, extra: dict[str, str], error: str
) -> None:
    ws = workspace_setup(hub)
    body = graphql(hub, ws.setup.tokens["developer"], CREATE, {"input": ws.create_input(**extra)}).json()
    payload = body["data"]["workspaceCreate"]
    assert payload["workspace"] is None
    assert any(error in e for e in payload["errors"]), payload
    assert hub.db.rows("SELECT count(*) AS n FROM workspaces") == [{"n": 0}]


def test_unknown_desired_state_on_update(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws)
    payload = graphql(hub, ws.setup.tokens["developer"], UPDATE, {"id": created["id"], "state": "Paused"}).json()
    assert "is not one of" in payload["data"]["workspaceUpdate"]["errors"][0]
    assert hub.db.rows("SELECT desired_state FROM workspaces") == [{"desired_state": "Running"}]


def test_workspaces_disabled_and_quota(hub: RealHub) -> None:
    ws = workspace_setup(hub, "remote_development:\n  enabled: false\n")
    body = graphql(hub, ws.setup.tokens["developer"], CREATE, {"input": ws.create_input()}).json()
    assert "workspaces are not enabled" in body["data"]["workspaceCreate"]["errors"][0]
    hub.api().put(
        f"/projects/{ws.setup.project_id}/cluster_agents/{ws.setup.agent_id}/configuration",
        content=b"remote_development: {enabled: true, dns_zone: w.example, workspaces_per_user_quota: 1}\n",
    ).raise_for_status()
    create(hub, ws)
    body = graphql(hub, ws.setup.tokens["developer"], CREATE, {"input": ws.create_input()}).json()
    assert "quota on this agent (1) is reached" in body["data"]["workspaceCreate"]["errors"][0]


def test_authentication_required(hub: RealHub) -> None:
    assert graphql(hub, "", LIST).status_code == 401
    assert graphql(hub, "glpat-wrong", LIST).status_code == 401


def test_agent_configuration_rules_name_the_field(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    path = f"/projects/{ws.setup.project_id}/cluster_agents/{ws.setup.agent_id}/configuration"
    response = hub.api().put(path, content=b"remote_development: {enabled: true}\n")
    assert response.status_code == 400
    assert response.json()["message"] == {
        "configuration.remote_development.dns_zone": ["is required when workspaces are enabled"]
    }
    response = hub.api().put(
        path, content=b"remote_development: {enabled: true, dns_zone: x, max_active_hours_before_stop: 9000}\n"
    )
    assert response.status_code == 400 and "max_active_hours_before_stop" in response.text
