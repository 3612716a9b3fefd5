"""The hub's per-user workspace limit (issue 27 item 3): ``workspaces.max_active_workspaces_per_user``.

One user with 1,000 workspaces made one GraphQL query cost 20 s and 62 MB. Every way of creating a workspace
(GraphQL, ``tether workspace create``, the console) is refused with the same clear error once the user has that
many workspaces not desired Terminated, over every agent; terminating one makes room; other users are unaffected.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.console.test_console_bad_input import browser_for
from tests.fixtures.hub import HubLauncher
from tests.hub.test_workspaces_cli import run
from tests.hub.workspace_helpers import CREATE, DEVFILE, UPDATE, create, graphql, workspace_setup
from tether.hub.config import load_config

LIMIT_REACHED = (
    "you have 2 active workspaces, the most this hub allows per user "
    "(workspaces.max_active_workspaces_per_user: 2): terminate one before creating another"
)


def test_default_and_override() -> None:
    assert load_config(None, environ={}).workspaces.max_active_workspaces_per_user == 50
    environ = {"TETHER_HUB_MAX_ACTIVE_WORKSPACES_PER_USER": "-1"}
    assert load_config(None, environ=environ).workspaces.max_active_workspaces_per_user == -1


@pytest.mark.parametrize("hub_backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_every_way_of_creating_stops_at_the_limit(hub_launcher: HubLauncher, tmp_path: Path) -> None:
    hub = hub_launcher.launch({"workspaces.max_active_workspaces_per_user": 2})
    ws = workspace_setup(hub)
    developer = ws.setup.tokens["developer"]
    first = create(hub, ws)
    create(hub, ws)
    count = hub.db.rows("SELECT count(*) AS n FROM workspaces")

    body = graphql(hub, developer, CREATE, {"input": ws.create_input()}).json()
    assert body["data"]["workspaceCreate"] == {"errors": [LIMIT_REACHED], "workspace": None}

    devfile = tmp_path / "devfile.yaml"
    devfile.write_text(DEVFILE)
    cli = run(
        hub, developer, "create", "--agent", str(ws.setup.agent_id), "--project", str(ws.setup.project_id),
        "--devfile", str(devfile),
    )  # fmt: skip
    assert cli.returncode == 1 and LIMIT_REACHED in cli.stderr, cli.stderr

    browser, csrf = browser_for(hub, "developer", developer)
    form = {"agent": str(ws.setup.agent_id), "project": str(ws.setup.project_id), "authenticity_token": csrf}
    page = browser.post("/workspaces", data={**form, "devfile": DEVFILE, "desired_state": "Running"})
    assert page.status_code == 400 and LIMIT_REACHED in page.text

    assert hub.db.rows("SELECT count(*) AS n FROM workspaces") == count
    # Another user has their own count.
    create(hub, ws, role="maintainer")
    # A terminated workspace no longer counts.
    ended = graphql(hub, developer, UPDATE, {"id": first["id"], "state": "Terminated"}).json()
    assert ended["data"]["workspaceUpdate"]["errors"] == []
    create(hub, ws)
