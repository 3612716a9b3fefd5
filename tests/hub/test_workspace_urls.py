"""Workspace addresses (issue 23 item 3) and the default devfile's image.

GraphQL's ``url`` follows ``kas.workspaces_url`` (the path form) as the console's Open link does, and names a
port the workspace serves; the editor is told the path it is served under; a workspace created without a
devfile gets GitLab's default devfile on the hub's ``workspaces.default_devfile_image``.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.fixtures.hub import HubLauncher
from tests.hub.workspace_helpers import CREATE, graphql, reconcile, workspace_setup

WORKSPACES_URL = "http://127.0.0.1:8156/"


def deployment(config: str) -> dict[str, Any]:
    [found] = [d for d in yaml.safe_load_all(config) if d and d["kind"] == "Deployment"]
    return dict(found)


def test_graphql_url_follows_the_path_form_and_the_editor_knows_its_path(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch(
        {"kas.workspaces_url": WORKSPACES_URL, "workspaces.default_devfile_image": "localhost/tether/busybox:local"}
    )
    ws = workspace_setup(hub)
    no_devfile = {k: v for k, v in ws.create_input(name="editor-ws").items() if k != "devfile"}
    payload = graphql(hub, ws.setup.tokens["developer"], CREATE, {"input": no_devfile}).json()
    created = payload["data"]["workspaceCreate"]["workspace"]
    assert created["url"] == f"{WORKSPACES_URL}-/workspaces/editor-ws/60001/?folder=%2Fprojects%2Fplatform%2Fclusters"
    query = "query { workspaces { nodes { url devfile } } }"
    [listed] = graphql(hub, ws.setup.tokens["developer"], query).json()["data"]["workspaces"]["nodes"]
    assert listed["url"] == created["url"]
    assert 'image: "localhost/tether/busybox:local"\n' in listed["devfile"]

    [info] = reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []}).json()["workspace_rails_infos"]
    pod = deployment(info["config_to_apply"])["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "gl-tools-injector"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["GL_EDITOR_BASE_PATH"] == "/-/workspaces/editor-ws/60001/"
