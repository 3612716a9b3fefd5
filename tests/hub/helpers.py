"""Building blocks for hub tests: a project with an agent and people in each role."""

from __future__ import annotations

from dataclasses import dataclass

from tests.fixtures.hub import RealHub


@dataclass
class Setup:
    """``platform/clusters`` with agent ``production`` and a user per role (tokens with scope ``api``)."""

    project_id: int
    agent_id: int
    tokens: dict[str, str]
    user_ids: dict[str, int]


ROLE_LEVELS = {"guest": 10, "reporter": 20, "developer": 30, "maintainer": 40}


def project_with_agent(hub: RealHub, roles: tuple[str, ...] = tuple(ROLE_LEVELS)) -> Setup:
    admin = hub.api()
    group = admin.post("/groups", json={"name": "Platform", "path": "platform"})
    assert group.status_code == 201, group.text
    project = admin.post("/projects", json={"name": "clusters", "namespace_id": group.json()["id"]})
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    agent = admin.post(f"/projects/{project_id}/cluster_agents", json={"name": "production"})
    assert agent.status_code == 201, agent.text
    tokens: dict[str, str] = {}
    user_ids: dict[str, int] = {}
    for role in roles:
        user_id, token = hub.user(role)
        response = admin.post(
            f"/projects/{project_id}/members", json={"user_id": user_id, "access_level": ROLE_LEVELS[role]}
        )
        assert response.status_code == 201, response.text
        tokens[role], user_ids[role] = token, user_id
    user_ids["outsider"], tokens["outsider"] = hub.user("outsider")
    return Setup(project_id, agent.json()["id"], tokens, user_ids)


def kas_config(hub: RealHub, setup: Setup, yaml_text: str) -> None:
    response = hub.api().put(
        f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration", content=yaml_text.encode()
    )
    assert response.status_code == 200, response.text
