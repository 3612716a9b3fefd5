"""Bad input: each case is a 4xx whose message names the problem, and the database is left exactly as it was."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fixtures.hub import RealHub
from tests.hub.helpers import Setup, project_with_agent

# Authentication notes a token's use; that is the one column a refused request may legitimately change.
IGNORE = ("personal_access_tokens.last_used_at",)


@pytest.fixture
def setup(hub: RealHub) -> Setup:
    setup = project_with_agent(hub, roles=("maintainer",))
    response = hub.api().put(
        f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration",
        content=b"observability:\n  logging:\n    level: debug\n",
    )
    assert response.status_code == 200
    return setup


def _send(api: httpx.Client, method: str, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return api.request(method, path, content=body, headers={"Content-Type": "application/json"})
    return api.request(method, path, json=body)


def cases(setup: Setup) -> list[tuple[str, str, str, Any, int, str]]:
    """(what, method, path, body, status, text the message must contain)."""
    agents = f"/projects/{setup.project_id}/cluster_agents"
    config = f"{agents}/{setup.agent_id}/configuration"
    return [
        ("malformed JSON", "POST", agents, b'{"name": "x",', 400, "not valid JSON"),
        ("JSON that is not an object", "POST", agents, b'["x"]', 400, "JSON object"),
        ("unknown field", "POST", agents, {"name": "x", "nmae": "y"}, 400, "nmae"),
        ("missing field", "POST", agents, {}, 400, "name is missing"),
        ("wrong type", "POST", agents, {"name": 5}, 400, "name"),
        ("too-long agent name", "POST", agents, {"name": "a" * 64}, 400, "maximum is 63"),
        ("agent name not a DNS label", "POST", agents, {"name": "Prod_1"}, 400, "lowercase"),
        ("duplicate agent name", "POST", agents, {"name": "production"}, 409, "has already been taken"),
        ("token without name", "POST", f"{agents}/{setup.agent_id}/tokens", {"description": "d"}, 400, "name"),
        ("too-long token name", "POST", f"{agents}/{setup.agent_id}/tokens", {"name": "n" * 256}, 400, "maximum"),
        (
            "config: wrong type",
            "PUT",
            config,
            b"user_access:\n  access_as: {agent: {}}\n  projects: oops\n",
            400,
            "user_access.projects",
        ),
        (
            "config: bad access_as",
            "PUT",
            config,
            b"user_access:\n  access_as: {agent: {}, user: {}}\n",
            400,
            "user_access.access_as",
        ),
        (
            "config: unknown field",
            "PUT",
            config,
            b"observability: {logging: {levle: debug}}\n",
            400,
            "observability.logging.levle",
        ),
        (
            "config: bad enum",
            "PUT",
            config,
            b"observability: {logging: {level: loud}}\n",
            400,
            "observability.logging.level",
        ),
        ("config: not YAML", "PUT", config, b"user_access: [\n", 400, "not valid YAML"),
        ("project: unknown field", "POST", "/projects", {"name": "p", "visibilty": "private"}, 400, "visibilty"),
        (
            "project: duplicate path",
            "POST",
            "/projects",
            {"name": "clusters", "namespace_id": "platform"},
            409,
            "has already been taken",
        ),
        ("group: invalid path", "POST", "/groups", {"name": "G", "path": "-bad"}, 400, "path"),
        (
            "member: invalid role",
            "POST",
            f"/projects/{setup.project_id}/members",
            {"user_id": setup.user_ids["outsider"], "access_level": 35},
            400,
            "access_level",
        ),
        (
            "member: duplicate",
            "POST",
            f"/projects/{setup.project_id}/members",
            {"user_id": setup.user_ids["maintainer"], "access_level": 30},
            409,
            "already exists",
        ),
        ("user: duplicate username", "POST", "/users", {"username": "MAINTAINER", "name": "x"}, 409, "username"),
        (
            "token: unknown scope",
            "POST",
            f"/users/{setup.user_ids['outsider']}/personal_access_tokens",
            {"name": "t", "scopes": ["api", "sudo"]},
            400,
            "sudo",
        ),
        (
            "token: expiry in the past",
            "POST",
            f"/users/{setup.user_ids['outsider']}/personal_access_tokens",
            {"name": "t", "scopes": ["api"], "expires_at": "2020-01-01"},
            400,
            "expires_at",
        ),
        (
            "token: bad date",
            "POST",
            f"/users/{setup.user_ids['outsider']}/personal_access_tokens",
            {"name": "t", "scopes": ["api"], "expires_at": "tomorrow"},
            400,
            "expires_at",
        ),
        ("page 0", "GET", f"{agents}?page=0", None, 400, "page"),
    ]


def test_bad_input_is_refused_and_changes_nothing(hub: RealHub, setup: Setup) -> None:
    api = hub.api()
    api.get("/user")
    before = hub.db.snapshot(IGNORE)
    for what, method, path, body, status, needle in cases(setup):
        response = _send(api, method, path, body)
        assert response.status_code == status, (what, response.status_code, response.text)
        assert needle in response.text, (what, response.text)
        assert hub.db.snapshot(IGNORE) == before, f"{what} changed the database"


def test_valid_config_after_refusals_is_stored_with_a_new_version(hub: RealHub, setup: Setup) -> None:
    config = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration"
    api = hub.api()
    assert api.put(config, content=b"user_access: 5\n").status_code == 400
    assert api.get(config).json()["version"] == 1
    response = api.put(config, content=b"user_access:\n  access_as: {user: {}}\n  groups: [{id: platform}]\n")
    assert response.status_code == 200
    body = response.json()
    assert body["version"] == 2
    assert body["configuration"] == {"user_access": {"access_as": {"user": {}}, "groups": [{"id": "platform"}]}}
    assert api.put(config, content=body["content"].encode()).json()["version"] == 2, "same text, same version"


#: Ids no row can have: one past the largest 64-bit id, a huge one, and non-ASCII digits ``str.isdigit`` accepts.
OUT_OF_RANGE_IDS = ("9223372036854775808", "18446744073709551616" * 3, "\u00b2", "\u0661\u0662", "0", "-1")


def test_ids_out_of_range_or_not_ascii_are_4xx_never_500(hub: RealHub, setup: Setup) -> None:
    """Issue 9 item 7: ids >= 2**63 overflowed SQLite and non-ASCII digits reached ``int()``: both were 500."""
    api = hub.api()
    agents = f"/projects/{setup.project_id}/cluster_agents"
    before = hub.db.snapshot(ignore=IGNORE)
    for bad in OUT_OF_RANGE_IDS:
        paths = [
            f"/projects/{bad}",
            f"/projects/{bad}/cluster_agents",
            f"{agents}/{bad}",
            f"{agents}/{bad}/tokens",
            f"{agents}/{setup.agent_id}/tokens/{bad}",
            f"{agents}/{bad}/configuration",
            f"/projects/{bad}/members/1",
            f"/projects/{setup.project_id}/members/{bad}",
            f"/groups/{bad}",
            f"/users/{bad}",
            f"/personal_access_tokens/{bad}",
            f"/personal_access_tokens?user_id={bad}",
        ]
        for path in paths:
            response = api.get(path)
            assert response.status_code in (400, 404), (path, response.status_code, response.text)
        for method, path in (("DELETE", f"{agents}/{bad}"), ("DELETE", f"/personal_access_tokens/{bad}")):
            response = api.request(method, path)
            assert response.status_code in (400, 404), (method, path, response.status_code, response.text)
        member = api.post(f"/projects/{setup.project_id}/members", json={"user_id": bad, "access_level": 30})
        assert member.status_code in (400, 404), (bad, member.text)
        for agent_id in (bad, int(bad) if bad.isascii() and bad.lstrip("-").isdigit() else None):
            body = {"agent_id": agent_id, "access_type": "personal_access_token", "access_key": "x"}
            with httpx.Client(base_url=f"{hub.api_url}/internal/kubernetes/", timeout=30) as internal:
                response = internal.post("authorize_proxy_user", json=body, headers=hub.kas_headers())
            assert response.status_code in (400, 401, 404), (agent_id, response.status_code, response.text)
    assert hub.db.snapshot(ignore=IGNORE) == before


#: A file written for GitLab (issue 22 item 6): sections Tether does not serve beside one it does.
GITLAB_CONFIG = b"""gitops:
  manifest_projects: [{id: platform/manifests}]
ci_access:
  projects: [{id: platform/app}]
starboard:
  vulnerability_report: {namespaces: [default]}
user_access:
  access_as: {agent: {}}
  projects: [{id: platform/clusters}]
"""


def test_gitlab_config_is_accepted_with_a_warning_per_ignored_section(hub: RealHub, setup: Setup) -> None:
    config = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration"
    api = hub.api()
    response = api.put(config, content=GITLAB_CONFIG)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [w.split(":")[0] for w in body["warnings"]] == [
        "configuration.gitops",
        "configuration.ci_access",
        "configuration.starboard",
    ]
    assert all("not served by Tether" in w for w in body["warnings"])
    # The text is kept as written; what kas hands agents keeps the sections that parse (an upstream agentk may
    # serve ci_access) and leaves out one of another GitLab version (gitops.manifest_projects) or unknown here.
    assert set(body["configuration"]) == {"ci_access", "user_access"}
    assert (
        "left out of what agents receive: configuration.gitops.manifest_projects unknown field" in (body["warnings"][0])
    )
    assert "left out" in body["warnings"][2] and "left out" not in body["warnings"][1]
    assert body["content"] == GITLAB_CONFIG.decode()
    # A typo in a section's name is still refused, not ignored.
    typo = api.put(config, content=b"user_acess:\n  access_as: {agent: {}}\n")
    assert typo.status_code == 400 and typo.json()["message"] == {"configuration.user_acess": ["unknown field"]}
