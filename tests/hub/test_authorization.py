"""Who may do what: roles (GitLab's "View agents" Developer, "Manage agents" Maintainer) and token scopes."""

from __future__ import annotations

from datetime import date

import pytest

from tests.fixtures.hub import RealHub
from tests.hub.helpers import Setup, project_with_agent


@pytest.fixture
def setup(hub: RealHub) -> Setup:
    return project_with_agent(hub)


# (role, read agent status, create agent status, create token status)
MATRIX = [
    ("maintainer", 200, 201, 201),
    ("developer", 200, 403, 403),
    ("reporter", 403, 403, 403),
    ("guest", 403, 403, 403),
    ("outsider", 404, 404, 404),
]


def test_role_matrix_for_agents_and_tokens(hub: RealHub, setup: Setup) -> None:
    agents = f"/projects/{setup.project_id}/cluster_agents"
    tokens = f"{agents}/{setup.agent_id}/tokens"
    for role, read, create_agent, create_token in MATRIX:
        api = hub.api(setup.tokens[role])
        assert api.get(f"{agents}/{setup.agent_id}").status_code == read, role
        assert api.get(agents).status_code == read, role
        assert api.get(tokens).status_code == read, role
        assert api.get(f"{agents}/{setup.agent_id}/configuration").status_code == read, role
        response = api.post(agents, json={"name": f"new-{role}"})
        assert response.status_code == create_agent, (role, response.text)
        response = api.post(tokens, json={"name": f"by-{role}"})
        assert response.status_code == create_token, (role, response.text)
        response = api.put(f"{agents}/{setup.agent_id}/configuration", content=b"observability: {}")
        assert response.status_code == (200 if role == "maintainer" else create_agent), role
        if create_agent == 403:
            assert "maintainer" in response.json()["message"]


def test_maintainer_revokes_and_deletes_developer_cannot(hub: RealHub, setup: Setup) -> None:
    agents = f"/projects/{setup.project_id}/cluster_agents"
    token = hub.api().post(f"{agents}/{setup.agent_id}/tokens", json={"name": "t"}).json()
    developer, maintainer = hub.api(setup.tokens["developer"]), hub.api(setup.tokens["maintainer"])
    assert developer.delete(f"{agents}/{setup.agent_id}/tokens/{token['id']}").status_code == 403
    assert developer.delete(f"{agents}/{setup.agent_id}").status_code == 403
    assert maintainer.delete(f"{agents}/{setup.agent_id}/tokens/{token['id']}").status_code == 204
    assert maintainer.delete(f"{agents}/{setup.agent_id}").status_code == 204
    assert maintainer.get(f"{agents}/{setup.agent_id}").status_code == 404


def test_group_membership_is_inherited(hub: RealHub, setup: Setup) -> None:
    user_id, token = hub.user("groupdev")
    api = hub.api(token)
    agent = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}"
    assert api.get(agent).status_code == 404
    assert hub.api().post("/groups/platform/members", json={"user_id": user_id, "access_level": 30}).status_code == 201
    assert api.get(agent).status_code == 200
    assert api.get("/projects").json()[0]["path_with_namespace"] == "platform/clusters"
    assert [g["full_path"] for g in api.get("/groups").json()] == ["platform"]
    sub = (
        hub.api()
        .post(
            "/groups", json={"name": "Sub", "path": "sub", "parent_id": hub.api().get("/groups/platform").json()["id"]}
        )
        .json()
    )
    assert [g["full_path"] for g in api.get("/groups").json()] == ["platform", "platform/sub"], sub
    assert hub.api(setup.tokens["maintainer"]).get("/groups").json() == [], "a project member is no group member"
    assert api.post(f"/projects/{setup.project_id}/cluster_agents", json={"name": "x"}).status_code == 403


def test_scopes(hub: RealHub, setup: Setup) -> None:
    maintainer_id = setup.user_ids["maintainer"]
    agents = f"/projects/{setup.project_id}/cluster_agents"
    read_only = hub.api(hub.token_for(maintainer_id, ("read_api",)))
    assert read_only.get(agents).status_code == 200
    refused = read_only.post(agents, json={"name": "ro"})
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"
    assert read_only.post(f"{agents}/{setup.agent_id}/tokens", json={"name": "ro"}).status_code == 403
    assert read_only.delete(f"{agents}/{setup.agent_id}").status_code == 403

    proxy_only = hub.api(hub.token_for(maintainer_id, ("k8s_proxy",)))
    response = proxy_only.get(agents)
    assert response.status_code == 403 and response.json()["scope"] == "api read_api"


def test_authentication_failures(hub: RealHub, setup: Setup) -> None:
    assert hub.api("").get("/user").status_code == 401
    assert hub.api("glpat-not-a-token").get("/user").json() == {"message": "401 Unauthorized"}
    bearer = hub.api("")
    bearer.headers["Authorization"] = f"Bearer {setup.tokens['developer']}"
    assert bearer.get("/user").json()["username"] == "developer"

    token = hub.token_for(setup.user_ids["developer"], ("api",))
    api = hub.api(token)
    assert api.get("/user").status_code == 200
    assert api.delete("/personal_access_tokens/self").status_code == 204
    assert api.get("/user").status_code == 401, "a revoked token no longer works"

    expiring = hub.token_for(setup.user_ids["developer"], ("api",))
    hub.db.execute(
        "UPDATE personal_access_tokens SET expires_at = :d WHERE id = (SELECT MAX(id) FROM personal_access_tokens)",
        d=date(2020, 1, 1),
    )
    assert hub.api(expiring).get("/user").status_code == 401, "an expired token no longer works"


def test_admin_only_and_self_service_tokens(hub: RealHub, setup: Setup) -> None:
    developer = hub.api(setup.tokens["developer"])
    assert developer.post("/users", json={"username": "mallory", "name": "M"}).status_code == 403
    response = developer.post(
        f"/users/{setup.user_ids['developer']}/personal_access_tokens", json={"name": "x", "scopes": ["api"]}
    )
    assert response.status_code == 403
    response = developer.post("/user/personal_access_tokens", json={"name": "x", "scopes": ["api"]})
    assert response.status_code == 400 and "scopes" in response.text
    response = developer.post("/user/personal_access_tokens", json={"name": "kubectl", "scopes": ["k8s_proxy"]})
    assert response.status_code == 201 and response.json()["scopes"] == ["k8s_proxy"]
    assert developer.get(f"/personal_access_tokens/{response.json()['id']}").status_code == 200
    assert (
        hub.api(setup.tokens["maintainer"]).get(f"/personal_access_tokens/{response.json()['id']}").status_code == 404
    )


def test_members_cannot_grant_above_their_role(hub: RealHub, setup: Setup) -> None:
    maintainer = hub.api(setup.tokens["maintainer"])
    members = f"/projects/{setup.project_id}/members"
    response = maintainer.post(members, json={"user_id": setup.user_ids["outsider"], "access_level": 50})
    assert response.status_code == 403
    response = maintainer.post(members, json={"user_id": "outsider", "access_level": 40})
    assert response.status_code == 201 and response.json()["username"] == "outsider"
    developer = hub.api(setup.tokens["developer"])
    response = developer.put(f"{members}/{setup.user_ids['guest']}", json={"access_level": 20})
    assert response.status_code == 403
