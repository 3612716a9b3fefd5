"""The internal API kas calls: JWT on every call, agent_info, agent_configuration, authorize_proxy_user."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import httpx
import jwt
import pytest

from tests.fixtures.hub import RealHub
from tests.hub.helpers import Setup, kas_config, project_with_agent
from tests.support.polling import poll_sync
from tether.tool.jwt_auth import AUDIENCE_GITLAB, AUDIENCE_KAS, ISSUER_GITLAB, ISSUER_KAS, mint


@pytest.fixture
def setup(hub: RealHub) -> Setup:
    return project_with_agent(hub)


def internal(hub: RealHub, headers: dict[str, str] | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=f"{hub.api_url}/internal/kubernetes/",
        headers=hub.kas_headers() if headers is None else headers,
        timeout=30,
    )


def agent_token(hub: RealHub, setup: Setup, name: str = "t") -> dict[str, Any]:
    path = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
    response = hub.api().post(path, json={"name": name})
    assert response.status_code == 201
    return dict(response.json())


def bad_jwts(hub: RealHub) -> dict[str, dict[str, str]]:
    now = time.time()
    header = "Gitlab-Kas-Api-Request"
    return {
        "missing": {},
        "empty": {header: ""},
        "garbage": {header: "not.a.jwt"},
        "wrong secret": {header: mint(os.urandom(32), ISSUER_KAS, AUDIENCE_GITLAB, 30)},
        "expired": {header: mint(hub.secret, ISSUER_KAS, AUDIENCE_GITLAB, 30, now=now - 120)},
        "wrong issuer": {header: mint(hub.secret, ISSUER_GITLAB, AUDIENCE_GITLAB, 30)},
        "wrong audience": {header: mint(hub.secret, ISSUER_KAS, AUDIENCE_KAS, 30)},
        "as Bearer": {header: "Bearer " + mint(hub.secret, ISSUER_KAS, AUDIENCE_GITLAB, 30)},
        "none algorithm": {
            header: jwt.encode(
                {"iss": ISSUER_KAS, "aud": AUDIENCE_GITLAB, "exp": int(now) + 30}, None, algorithm="none"
            )
        },
    }


def token_used(hub: RealHub) -> Any:
    """A check that the (only) agent token's ``last_used_at`` is set."""
    return lambda: hub.db.rows("SELECT last_used_at FROM cluster_agent_tokens")[0]["last_used_at"] is not None


def test_every_internal_call_needs_the_kas_jwt(hub: RealHub, setup: Setup) -> None:
    token = agent_token(hub, setup)["token"]
    agent = {"Authorization": f"Bearer {token}"}
    proxy_body = {"agent_id": setup.agent_id, "access_type": "personal_access_token", "access_key": "x"}
    for what, headers in bad_jwts(hub).items():
        client = internal(hub, headers)
        calls = [
            client.get("agent_info", headers=agent),
            client.get("agent_configuration", headers=agent),
            client.post("authorize_proxy_user", json=proxy_body),
            client.post("authorize_proxy_user", content=b"{malformed", headers={"Content-Type": "application/json"}),
            client.get("no_such_endpoint"),
        ]
        for response in calls:
            assert response.status_code == 401, (what, response.request.url, response.text)
            assert "Gitlab-Kas-Api-Request" in response.json()["message"], what
    ok = internal(hub)
    assert ok.get("agent_info", headers=agent).status_code == 200
    assert ok.get("no_such_endpoint").status_code == 404
    poll_sync(token_used(hub), "the token's last_used_at")


def test_agent_info_for_valid_unknown_and_revoked_tokens(hub: RealHub, setup: Setup) -> None:
    created = agent_token(hub, setup)
    token = created["token"]
    client = internal(hub)
    assert hub.db.rows("SELECT last_used_at FROM cluster_agent_tokens")[0]["last_used_at"] is None
    expected = {
        "project_id": setup.project_id,
        "agent_id": setup.agent_id,
        "agent_name": "production",
        # Well-formed (upstream kas validates them); no Gitaly service configured in this hub.
        "gitaly_info": {"address": "tcp://gitaly.invalid:0", "token": "", "features": {}},
        "gitaly_repository": {
            "storage_name": "tether",
            "relative_path": "platform/clusters.git",
            "gl_repository": f"project-{setup.project_id}",
            "gl_project_path": "platform/clusters",
        },
        "default_branch": "main",
    }
    for headers in (
        {"Authorization": f"Bearer {token}"},
        {"Gitlab-Agent-Api-Request": token},
        {"Authorization": f"Bearer {token}", "Gitlab-Agent-Api-Request": token},
    ):
        response = client.get("agent_info", headers=headers)
        assert response.status_code == 200 and response.json() == expected
    poll_sync(token_used(hub), "the token's last_used_at")  # written in batches, about a second later
    shown = hub.api().get(f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens/{created['id']}")
    assert shown.json()["last_used_at"] is not None

    assert client.get("agent_info").status_code == 401
    assert client.get("agent_info", headers={"Authorization": "Bearer glagent-unknown"}).status_code == 401
    mixed = {"Authorization": f"Bearer {token}", "Gitlab-Agent-Api-Request": "other"}
    assert client.get("agent_info", headers=mixed).status_code == 401

    path = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens/{created['id']}"
    assert hub.api().delete(path).status_code == 204
    response = client.get("agent_info", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401 and response.json() == {"message": "401 Unauthorized"}
    assert client.get("agent_configuration", headers={"Gitlab-Agent-Api-Request": token}).status_code == 401

    other = agent_token(hub, setup, "other")["token"]
    assert client.get("agent_info", headers={"Authorization": f"Bearer {other}"}).status_code == 200
    hub.api().delete(f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}")
    assert client.get("agent_info", headers={"Authorization": f"Bearer {other}"}).status_code == 401


def test_agent_configuration_follows_every_change(hub: RealHub, setup: Setup) -> None:
    token = agent_token(hub, setup)["token"]
    client = internal(hub)
    headers = {"Gitlab-Agent-Api-Request": token}
    empty = client.get("agent_configuration", headers=headers).json()
    assert empty["configuration"] == {} and empty["project_path"] == "platform/clusters"
    assert len(empty["commit_id"]) == 40

    kas_config(hub, setup, "observability:\n  logging:\n    level: debug\n    grpc_level: warn\n")
    first = client.get("agent_configuration", headers=headers).json()
    assert first["configuration"] == {"observability": {"logging": {"level": "debug", "grpc_level": "warn"}}}
    assert first["commit_id"] != empty["commit_id"]
    assert client.get("agent_configuration", headers=headers).json()["commit_id"] == first["commit_id"]

    kas_config(hub, setup, "ci_access:\n  projects:\n  - id: platform/clusters\n    default_namespace: apps\n")
    second = client.get("agent_configuration", headers=headers).json()
    assert second["commit_id"] not in (empty["commit_id"], first["commit_id"])
    assert second["configuration"] == {
        "ci_access": {"projects": [{"id": "platform/clusters", "default_namespace": "apps"}]}
    }


def _authorize(hub: RealHub, setup: Setup, key: str, access_type: str = "personal_access_token") -> httpx.Response:
    body = {"agent_id": setup.agent_id, "access_type": access_type, "access_key": key, "csrf_token": ""}
    return internal(hub).post("authorize_proxy_user", json=body)


def test_authorize_proxy_user_access_as_agent(hub: RealHub, setup: Setup) -> None:
    developer = hub.token_for(setup.user_ids["developer"], ("k8s_proxy",))
    response = _authorize(hub, setup, developer)
    assert response.status_code == 403 and "user_access" in response.json()["message"]

    kas_config(hub, setup, "user_access:\n  access_as:\n    agent: {}\n  projects:\n  - id: platform/clusters\n")
    response = _authorize(hub, setup, developer)
    assert response.status_code == 200, response.text
    answer = response.json()
    # Tether's addition beside upstream's shape: the id of the token used, for kas' audit trail (issue 25).
    assert answer.pop("audit") == {"credential_id": hub.token_id(developer)}
    assert answer == {
        "agent": {"id": setup.agent_id, "config_project": {"id": setup.project_id}},
        "user": {"id": setup.user_ids["developer"], "username": "developer"},
        "access_as": {"agent": {}},
    }

    reporter = hub.token_for(setup.user_ids["reporter"], ("k8s_proxy",))
    assert _authorize(hub, setup, reporter).status_code == 403
    outsider = hub.token_for(setup.user_ids["outsider"], ("k8s_proxy",))
    assert _authorize(hub, setup, outsider).status_code == 403
    no_scope = hub.token_for(setup.user_ids["developer"], ("api", "read_api"))
    response = _authorize(hub, setup, no_scope)
    assert response.status_code == 403 and "k8s_proxy" in response.json()["message"]
    assert _authorize(hub, setup, "glpat-nope").status_code == 401
    response = _authorize(hub, setup, developer, "session_cookie")
    assert response.status_code == 401 and "session" in response.json()["message"]
    assert _authorize(hub, setup, developer, "ci_job").status_code == 401
    body = {"agent_id": 999999, "access_type": "personal_access_token", "access_key": developer}
    assert internal(hub).post("authorize_proxy_user", json=body).status_code == 404
    response = internal(hub).post("authorize_proxy_user", json={"agent_id": setup.agent_id, "access_type": "x"})
    assert response.status_code == 400 and "access_key is missing" in response.json()["error"]


def test_authorize_proxy_user_access_as_user_with_groups(hub: RealHub, setup: Setup) -> None:
    admin = hub.api()
    other = admin.post("/groups", json={"name": "Apps", "path": "apps"}).json()
    sub = admin.post("/groups", json={"name": "Web", "path": "web", "parent_id": other["id"]}).json()
    user_id, _ = hub.user("carol")
    assert (
        admin.post(f"/groups/{other['id']}/members", json={"user_id": user_id, "access_level": 40}).status_code == 201
    )
    kas_config(
        hub,
        setup,
        "user_access:\n  access_as:\n    user: {}\n  groups:\n  - id: apps/web\n  - id: missing/group\n",
    )
    carol = hub.token_for(user_id, ("k8s_proxy",))
    response = _authorize(hub, setup, carol)
    assert response.status_code == 200, response.text
    assert response.json()["access_as"] == {
        "user": {"projects": [], "groups": [{"id": sub["id"], "roles": ["maintainer"]}]}
    }

    developer = hub.token_for(setup.user_ids["developer"], ("k8s_proxy",))
    response = _authorize(hub, setup, developer)
    assert response.status_code == 200, "members of the agent's own project are authorized"
    assert response.json()["access_as"] == {
        "user": {"projects": [{"id": setup.project_id, "roles": ["developer"]}], "groups": []}
    }

    revoked = hub.api(carol)
    assert revoked.get("/user").status_code == 403  # a k8s_proxy-only token has no REST access
    token_id = max(t["id"] for t in hub.api().get("/personal_access_tokens", params={"user_id": user_id}).json())
    assert hub.api().delete(f"/personal_access_tokens/{token_id}").status_code == 204
    assert _authorize(hub, setup, carol).status_code == 401


def test_agent_lookups_only_read_and_note_uses_in_one_later_write(hub: RealHub, setup: Setup) -> None:
    """kas asks for every agent connection (10,000 at once after a restart, issue 9): ``agent_info`` and
    ``agent_configuration`` answer while another writer holds SQLite's write lock, and every token's use is
    written once the lock is free."""
    if not hub.config.database_url.startswith("sqlite"):
        pytest.skip("SQLite's database-wide write lock; PostgreSQL readers never wait for writers")
    created = [agent_token(hub, setup, name=f"t{i}") for i in range(3)]
    client = internal(hub)
    client.timeout = httpx.Timeout(5.0)
    writer = sqlite3.connect(hub.config.database_url.split("///", 1)[1], isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the hub's writers would now wait up to its 30 s busy timeout
        for token in created:
            headers = {"Authorization": f"Bearer {token['token']}"}
            assert client.get("agent_info", headers=headers).status_code == 200
            configuration = client.get("agent_configuration", headers=headers)
            assert configuration.status_code == 200 and configuration.json()["project_path"] == "platform/clusters"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    poll_sync(
        lambda: all(row["last_used_at"] for row in hub.db.rows("SELECT last_used_at FROM cluster_agent_tokens")),
        "every token's last_used_at",
    )
