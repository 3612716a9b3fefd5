"""Deleting a project or group removes its agents, tokens and configuration; the tokens stop working."""

from __future__ import annotations

from tests.fixtures.hub import RealHub
from tests.hub.helpers import project_with_agent


def test_deleting_a_group_removes_everything_below_it(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("maintainer",))
    api = hub.api()
    agents = f"/projects/{setup.project_id}/cluster_agents"
    token = api.post(f"{agents}/{setup.agent_id}/tokens", json={"name": "t"}).json()["token"]
    assert api.put(f"{agents}/{setup.agent_id}/configuration", content=b"observability: {}\n").status_code == 200
    internal = f"{hub.api_url}/internal/kubernetes/agent_info"
    headers = {**hub.kas_headers(), "Authorization": f"Bearer {token}"}
    assert api.get(internal, headers=headers).status_code == 200

    maintainer = hub.api(setup.tokens["maintainer"])
    assert maintainer.delete("/groups/platform").status_code == 404, "not a member of the group: hidden"
    member = {"user_id": setup.user_ids["maintainer"], "access_level": 40}
    assert api.post("/groups/platform/members", json=member).status_code == 201
    assert maintainer.delete("/groups/platform").status_code == 403, "Owner only"
    response = api.delete("/groups/platform")
    assert response.status_code == 202 and response.json() == {"message": "202 Accepted"}
    assert api.get(f"/projects/{setup.project_id}").status_code == 404
    assert api.get(internal, headers=headers).status_code == 401
    for table in ("projects", "cluster_agents", "cluster_agent_tokens", "agent_configurations", "project_members"):
        assert hub.db.rows(f"SELECT * FROM {table}") == [], table
    assert api.post("/groups", json={"name": "Platform", "path": "platform"}).status_code == 201, "path is free again"


def test_deleting_a_project_keeps_ids_unique(hub: RealHub) -> None:
    api = hub.api()
    first = api.post("/projects", json={"name": "one"}).json()
    agent = api.post(f"/projects/{first['id']}/cluster_agents", json={"name": "a"}).json()
    assert api.delete(f"/projects/{first['id']}").status_code == 202
    second = api.post("/projects", json={"name": "one"}).json()
    again = api.post(f"/projects/{second['id']}/cluster_agents", json={"name": "a"}).json()
    assert second["id"] > first["id"] and again["id"] > agent["id"], "agent ids are never reused (kas caches them)"
