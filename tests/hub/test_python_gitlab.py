"""python-gitlab, a real GitLab client from PyPI, drives the hub: projects, cluster agents, agent tokens."""

from __future__ import annotations

import gitlab
import pytest

from tests.fixtures.hub import RealHub


def test_project_agent_and_tokens_with_python_gitlab(hub: RealHub) -> None:
    gl = hub.gitlab()
    gl.auth()
    assert gl.user is not None and gl.user.username == "root"

    group = gl.groups.create({"name": "Platform", "path": "platform"})
    project = gl.projects.create({"name": "clusters", "namespace_id": group.id})
    assert project.path_with_namespace == "platform/clusters"
    assert gl.projects.get("platform/clusters").id == project.id  # URL-encoded full path

    agent = project.cluster_agents.create({"name": "production"})
    assert agent.name == "production" and agent.config_project["id"] == project.id
    assert [a.name for a in project.cluster_agents.list(get_all=True)] == ["production"]
    fetched = project.cluster_agents.get(agent.id)
    assert fetched.connections == [] and fetched.connections_error  # no kas configured in this hub

    base = f"/projects/{project.id}/cluster_agents/{agent.id}/tokens"
    first = gl.http_post(base, post_data={"name": "first", "description": "rotation 1"})
    second = gl.http_post(base, post_data={"name": "second"})
    assert first["token"].startswith("glagent-") and second["token"] != first["token"]
    listed = gl.http_list(base, get_all=True)
    assert [t["name"] for t in listed] == ["first", "second"]
    assert all("token" not in t for t in listed), "a token is shown only when created"
    assert gl.http_get(f"{base}/{first['id']}")["status"] == "active"

    gl.http_delete(f"{base}/{first['id']}")
    assert [t["name"] for t in gl.http_list(base, get_all=True)] == ["second"]
    with pytest.raises(gitlab.GitlabHttpError) as missing:
        gl.http_get(f"{base}/{first['id']}")
    assert missing.value.response_code == 404

    with pytest.raises(gitlab.GitlabCreateError) as duplicate:
        project.cluster_agents.create({"name": "production"})
    assert duplicate.value.response_code == 409 and "name" in str(duplicate.value)

    agent.delete()
    assert project.cluster_agents.list(get_all=True) == []


def test_members_and_users_with_python_gitlab(hub: RealHub) -> None:
    gl = hub.gitlab()
    alice = gl.users.create({"username": "alice", "name": "Alice"})
    project = gl.projects.create({"name": "apps"})
    assert project.path_with_namespace == "root/apps"
    project.members.create({"user_id": alice.id, "access_level": gitlab.const.AccessLevel.DEVELOPER})
    assert {m.username: m.access_level for m in project.members.list(get_all=True)} == {"root": 50, "alice": 30}
    assert [u.username for u in gl.users.list(username="alice")] == ["alice"]
