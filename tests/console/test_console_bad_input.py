"""Bad input on the console's routes, against the real hub: sessions, CSRF, other users' data, HTML in names.

Plain HTTP (httpx) is enough here: these are the requests a hostile page or a curious user could send.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import httpx
import pytest

from tests.fixtures.hub import RealHub
from tests.hub.helpers import Setup, kas_config, project_with_agent
from tests.hub.workspace_helpers import DEVFILE, RD_CONFIG

PAGES = ["/projects", "/tokens", "/workspaces", "/projects/1", "/projects/1/agents/1", "/projects/1/agents/1/graph"]


def browser_for(hub: RealHub, login: str, token: str) -> tuple[httpx.Client, str]:
    """An httpx client signed in through the console's form; returns it and the session's CSRF token."""
    client = httpx.Client(base_url=hub.url, timeout=30)
    answer = client.post("/sign_in", data={"login": login, "token": token})
    assert answer.status_code == 303, answer.text
    page = client.get("/projects")
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert found is not None, page.text
    return client, found.group(1)


def test_pages_need_a_session(hub: RealHub) -> None:
    with httpx.Client(base_url=hub.url, timeout=30) as anonymous:
        for path in PAGES:
            answer = anonymous.get(path)
            assert (answer.status_code, answer.headers.get("location")) == (303, "/"), path
        answer = anonymous.get("/projects", headers={"HX-Request": "true"})
        assert (answer.status_code, answer.headers.get("HX-Redirect")) == (401, "/")
        anonymous.cookies.set("_gitlab_session", "made-up")
        assert anonymous.get("/projects").status_code == 303
        assert anonymous.post("/projects", data={"name": "x"}).status_code == 303
    assert hub.db.rows("SELECT id FROM projects") == []


def test_pages_name_an_icon_the_hub_serves(hub: RealHub) -> None:
    """Browsers ask for an icon on every page; without one each page load logged a 404 in the browser."""
    with httpx.Client(base_url=hub.url, timeout=30) as anonymous:
        page = anonymous.get("/")
        found = re.search(r'<link rel="icon" href="([^"]+)"', page.text)
        assert found is not None, page.text
        icon = anonymous.get(found.group(1))
        assert icon.status_code == 200
        assert icon.headers["content-type"].startswith("image/svg+xml")


def test_no_change_without_the_sessions_csrf_token(hub: RealHub) -> None:
    _uid, token = hub.user("alice")
    alice, csrf = browser_for(hub, "alice", token)
    before = hub.db.snapshot(ignore=("user_sessions.last_used_at",))
    for data, headers in (
        ({"name": "p1"}, {}),
        ({"name": "p1", "authenticity_token": "not-the-token"}, {}),
        ({"name": "p1"}, {"X-Csrf-Token": csrf + "x"}),
        ({"name": "p1", "authenticity_token": csrf}, {"Origin": "http://evil.example"}),
    ):
        answer = alice.post("/projects", data=data, headers=headers)
        assert answer.status_code == 403, answer.text
        assert "CSRF" in answer.text or "another origin" in answer.text
    assert alice.post("/tokens", data={"name": "t", "scope_k8s_proxy": "1"}).status_code == 403
    assert alice.post("/sign_out").status_code == 403  # the session stays
    assert hub.db.snapshot(ignore=("user_sessions.last_used_at",)) == before

    created = alice.post("/projects", data={"name": "p1", "authenticity_token": csrf})
    assert created.status_code == 303, created.text
    project_id = int(created.headers["location"].rsplit("/", 1)[1])
    agent = alice.post(f"/projects/{project_id}/agents", data={"name": "a1"}, headers={"X-Csrf-Token": csrf})
    assert agent.status_code == 303, agent.text
    agent_path = agent.headers["location"]
    for path, data in (
        (f"{agent_path}/tokens", {"name": "t"}),
        (f"{agent_path}/configuration", {"content": "observability: {}\n"}),
    ):
        assert alice.post(path, data=data).status_code == 403
    assert hub.db.rows("SELECT id FROM cluster_agent_tokens") == []
    assert hub.db.rows("SELECT agent_id FROM agent_configurations") == []


def test_users_see_only_their_own_projects_agents_and_tokens(hub: RealHub) -> None:
    _a, alice_token = hub.user("alice")
    _b, bob_token = hub.user("bob")
    alice, alice_csrf = browser_for(hub, "alice", alice_token)
    bob, bob_csrf = browser_for(hub, "bob", bob_token)
    project = alice.post("/projects", data={"name": "secret-project", "authenticity_token": alice_csrf})
    project_path = project.headers["location"]
    agent_path = alice.post(
        f"{project_path}/agents", data={"name": "agent-x9", "authenticity_token": alice_csrf}
    ).headers["location"]
    alice_pat = hub.db.rows("SELECT id FROM personal_access_tokens WHERE user_id = 2")[0]["id"]

    assert "secret-project" not in bob.get("/projects").text
    for path in (project_path, agent_path, f"{agent_path}/graph", f"{agent_path}/connections"):
        answer = bob.get(path)
        assert answer.status_code == 404, path
        assert "not found, or you do not have access to it" in answer.text
        assert "agent-x9" not in answer.text and "secret-project" not in answer.text
    stolen = bob.post(f"{agent_path}/tokens", data={"name": "mine", "authenticity_token": bob_csrf})
    assert stolen.status_code == 404
    revoke = bob.post(f"/tokens/{alice_pat}/revoke", data={"authenticity_token": bob_csrf})
    assert revoke.status_code == 404
    assert hub.db.rows("SELECT revoked FROM personal_access_tokens WHERE id = :i", i=alice_pat) == [{"revoked": False}]
    assert hub.db.rows("SELECT id FROM cluster_agent_tokens") == []
    assert "secret-project" in alice.get("/projects").text


def test_html_in_names_is_escaped(hub: RealHub) -> None:
    _uid, token = hub.user("alice")
    alice, csrf = browser_for(hub, "alice", token)
    evil = '<img src=x onerror="alert(1)">'
    created = alice.post("/projects", data={"name": "p", "description": evil, "authenticity_token": csrf})
    project_path = created.headers["location"]
    agent_path = alice.post(f"{project_path}/agents", data={"name": "a", "authenticity_token": csrf}).headers[
        "location"
    ]
    token_page = alice.post(
        f"{agent_path}/tokens", data={"name": evil, "description": evil, "authenticity_token": csrf}
    )
    config = alice.post(f"{agent_path}/configuration", data={"content": f"{evil}: 1\n", "authenticity_token": csrf})
    assert config.status_code == 400
    for page in (alice.get("/projects"), alice.get(project_path), token_page, alice.get(agent_path), config):
        assert "<img src=x" not in page.text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in alice.get(project_path).text
    assert "script-src 'self'" in alice.get(agent_path).headers["content-security-policy"]


def test_personal_tokens_created_in_the_console_are_k8s_proxy_only(hub: RealHub) -> None:
    _uid, token = hub.user("alice")
    alice, csrf = browser_for(hub, "alice", token)
    refused = alice.post("/tokens", data={"name": "t", "scope_api": "1", "authenticity_token": csrf})
    assert refused.status_code == 400
    assert "scopes can only contain available scopes (k8s_proxy)" in refused.text
    created = alice.post("/tokens", data={"name": "t", "scope_k8s_proxy": "1", "authenticity_token": csrf})
    assert created.status_code == 201
    assert re.search(r"glpat-[A-Za-z0-9_-]+", created.text)
    assert alice.get("/tokens").text.count("glpat-") == 0  # shown only once


async def test_graph_relay_refuses_other_origins_and_needs_kas(hub: RealHub) -> None:
    url = hub.url.replace("http://", "ws://") + "/-/console/graph?gitlab-agent-id=1&gitlab-csrf-token=x"
    async with aiohttp.ClientSession() as client:
        for origin in ("http://evil.example", None):
            headers = {"Origin": origin} if origin else {}
            try:
                ws = await client.ws_connect(url, protocols=("gitlab-agent-graph-api",), headers=headers)
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 403
                continue
            message = await asyncio.wait_for(ws.receive(), 10)
            assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 1008, message
        ws = await client.ws_connect(url, protocols=("gitlab-agent-graph-api",), headers={"Origin": hub.url})
        error = await asyncio.wait_for(ws.receive_json(), 10)
        assert "kas.k8s_proxy_url" in error["error"]["reason"]
        closed = await asyncio.wait_for(ws.receive(), 10)
        assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1011


@pytest.mark.parametrize("bad", ["/projects/abc", "/projects/1/agents/x/graph", "/tokens/zz/revoke"])
def test_malformed_ids_are_refused(hub: RealHub, bad: str) -> None:
    _uid, token = hub.user("alice")
    alice, _csrf = browser_for(hub, "alice", token)
    answer = alice.get(bad) if "revoke" not in bad else alice.post(bad)
    assert answer.status_code in (400, 404, 405, 422)


# --- Workspaces ---------------------------------------------------------------------------------------------------


def workspace_form(setup: Setup, csrf: str | None, **extra: str) -> dict[str, str]:
    form = {
        "project": str(setup.project_id),
        "agent": str(setup.agent_id),
        "desired_state": "Running",
        "devfile": DEVFILE,
        **extra,
    }
    if csrf is not None:
        form["authenticity_token"] = csrf
    return form


def test_workspaces_change_nothing_without_the_sessions_csrf_token(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("developer",))
    kas_config(hub, setup, RD_CONFIG)
    dev, csrf = browser_for(hub, "developer", setup.tokens["developer"])
    for data, headers in (
        (workspace_form(setup, None, name="ws-a"), {}),
        (workspace_form(setup, "not-the-token", name="ws-a"), {}),
        (workspace_form(setup, csrf, name="ws-a"), {"Origin": "http://evil.example"}),
    ):
        answer = dev.post("/workspaces", data=data, headers=headers)
        assert answer.status_code == 403, answer.text
    assert hub.db.rows("SELECT id FROM workspaces") == []

    created = dev.post("/workspaces", data=workspace_form(setup, csrf, name="ws-a"))
    assert created.status_code == 303, created.text
    (row,) = hub.db.rows("SELECT id, desired_state FROM workspaces")
    assert row["desired_state"] == "Running"
    for data in ({"desired_state": "Stopped"}, {"desired_state": "Stopped", "authenticity_token": csrf + "x"}):
        assert dev.post(f"/workspaces/{row['id']}/state", data=data).status_code == 403
    assert hub.db.rows("SELECT desired_state FROM workspaces") == [{"desired_state": "Running"}]
    stopped = dev.post(
        f"/workspaces/{row['id']}/state", data={"desired_state": "Stopped"}, headers={"X-Csrf-Token": csrf}
    )
    assert stopped.status_code == 303
    assert hub.db.rows("SELECT desired_state FROM workspaces") == [{"desired_state": "Stopped"}]


def test_users_see_and_change_only_their_own_workspaces(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("developer", "maintainer"))
    kas_config(hub, setup, RD_CONFIG)
    dev, dev_csrf = browser_for(hub, "developer", setup.tokens["developer"])
    other, other_csrf = browser_for(hub, "maintainer", setup.tokens["maintainer"])
    outsider, outsider_csrf = browser_for(hub, "outsider", setup.tokens["outsider"])
    assert dev.post("/workspaces", data=workspace_form(setup, dev_csrf, name="devs-own")).status_code == 303
    (row,) = hub.db.rows("SELECT id FROM workspaces")
    assert "devs-own" in dev.get("/workspaces").text

    for client, csrf in ((other, other_csrf), (outsider, outsider_csrf)):
        assert "devs-own" not in client.get("/workspaces").text
        assert "devs-own" not in client.get("/workspaces/live").text
        for state in ("Stopped", "Terminated"):
            answer = client.post(
                f"/workspaces/{row['id']}/state", data={"desired_state": state, "authenticity_token": csrf}
            )
            assert answer.status_code == 404, answer.text
            assert "not found, or you do not have access to it" in answer.text and "devs-own" not in answer.text
    assert hub.db.rows("SELECT desired_state FROM workspaces") == [{"desired_state": "Running"}]

    # The outsider is no member of the project: neither it nor its agent is offered, and a forged form fails.
    page = outsider.get("/workspaces").text
    assert "platform/clusters" not in page and "no-workspace-agents" in page
    forged = outsider.post("/workspaces", data=workspace_form(setup, outsider_csrf, name="outsiders"))
    assert forged.status_code == 404
    assert len(hub.db.rows("SELECT id FROM workspaces")) == 1


def test_workspace_values_are_escaped_and_errors_plain(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("developer",))
    kas_config(hub, setup, RD_CONFIG)
    dev, csrf = browser_for(hub, "developer", setup.tokens["developer"])
    evil = '<img src=x onerror="alert(1)">'
    refused = dev.post("/workspaces", data=workspace_form(setup, csrf, name=evil))
    assert refused.status_code == 400
    assert "<img src=x" not in refused.text
    assert "is not a DNS label" in refused.text and "&lt;img src=x" in refused.text
    assert "name" in refused.text and "clusterAgentId" not in refused.text
    bad_devfile = dev.post(
        "/workspaces", data=workspace_form(setup, csrf, devfile="schemaVersion: 2.2.0\nkomponents: []\n")
    )
    assert bad_devfile.status_code == 400 and "komponents" in bad_devfile.text
    assert "komponents: []" in bad_devfile.text  # the devfile is kept in the form

    created = dev.post(
        "/workspaces", data=workspace_form(setup, csrf, name="ws-html", project_ref=evil, devfile_path=evil)
    )
    assert created.status_code == 303, created.text
    for page in (dev.get("/workspaces"), dev.get("/workspaces/live")):
        assert "<img src=x" not in page.text
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page.text

    (row,) = hub.db.rows("SELECT id FROM workspaces")
    terminate = {"desired_state": "Terminated", "authenticity_token": csrf}
    assert dev.post(f"/workspaces/{row['id']}/state", data=terminate).status_code == 303
    again = dev.post(f"/workspaces/{row['id']}/state", data={"desired_state": "Running", "authenticity_token": csrf})
    assert again.status_code == 400 and "cannot be updated" in again.text
    unknown = dev.post(
        f"/workspaces/{row['id']}/state", data={"desired_state": "<b>Up</b>", "authenticity_token": csrf}
    )
    assert unknown.status_code == 400 and "<b>Up</b>" not in unknown.text


def test_workspace_list_is_sent_again_only_when_it_changes(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("developer",))
    kas_config(hub, setup, RD_CONFIG)
    dev, csrf = browser_for(hub, "developer", setup.tokens["developer"])
    assert dev.post("/workspaces", data=workspace_form(setup, csrf, name="ws-live")).status_code == 303
    first = dev.get("/workspaces/live")
    digest = re.search(r'data-digest="([0-9a-f]+)"', first.text)
    assert first.status_code == 200 and digest is not None
    assert dev.get("/workspaces/live", params={"v": digest.group(1)}).status_code == 204
    (row,) = hub.db.rows("SELECT id FROM workspaces")
    assert (
        dev.post(
            f"/workspaces/{row['id']}/state", data={"desired_state": "Stopped", "authenticity_token": csrf}
        ).status_code
        == 303
    )
    changed = dev.get("/workspaces/live", params={"v": digest.group(1)})
    assert changed.status_code == 200 and 'data-desired="Stopped"' in changed.text


def test_workspace_ids_out_of_range_are_refused(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=("developer",))
    kas_config(hub, setup, RD_CONFIG)
    dev, csrf = browser_for(hub, "developer", setup.tokens["developer"])
    huge = "9" * 30
    for agent, project in (
        (huge, str(setup.project_id)),
        ("\u00b2", str(setup.project_id)),
        (str(setup.agent_id), huge),
    ):
        answer = dev.post("/workspaces", data=workspace_form(setup, csrf, agent=agent, project=project))
        assert answer.status_code == 400, answer.text
        assert "is not an id" in answer.text
    for path in (f"/workspaces/{huge}/state", "/workspaces/0/state", "/workspaces/x/state"):
        answer = dev.post(path, data={"desired_state": "Stopped", "authenticity_token": csrf})
        assert answer.status_code in (400, 422), (path, answer.status_code)
    assert hub.db.rows("SELECT id FROM workspaces") == []
