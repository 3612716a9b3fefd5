"""The editor injected as GitLab does (issue 23 item 2; reference workspaces.md §4.2) and the URL's port (item 3).

The component with ``gl/inject-editor: true`` gets the tools-injector init container, which copies the editor
into the data volume, and runs the editor on port 60001 beside its own command; other devfiles are unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

from tether.hub.db.workspaces import Workspace
from tether.hub.workspaces.access import exposed_ports
from tether.hub.workspaces.address import address, editor_base_path
from tether.hub.workspaces.operations import url_port
from tether.modules.remote_development.hub.desired_config import (
    DATA_MOUNT,
    EDITOR_PORT,
    TOOLS_DIR,
    TOOLS_INJECTOR_IMAGE,
    WorkspaceSpec,
    resources,
)
from tether.modules.remote_development.hub.devfile import DEFAULT_DEVFILE, DevfileError, default_devfile, parse_devfile
from tether.modules.remote_development.hub.rules import Inclusion
from tether.modules.remote_development.hub.settings import WorkspacesSettings
from tether.modules.workspace_access.rpc.headers import response_headers
from tether_devenv.tools_image import GL_TOOLS_DIR, TOOLS_IMAGE

WITH_COMMAND = """schemaVersion: 2.2.0
components:
  - name: dev
    attributes: {gl/inject-editor: true}
    container:
      image: alpine:3
      command: [sleep]
      args: [infinity]
      endpoints: [{name: web, targetPort: 8080}]
"""
PLAIN = """schemaVersion: 2.2.0
components:
  - name: dev
    container:
      image: alpine:3
      endpoints: [{name: web, targetPort: 8080}]
"""


def objects(devfile: str, base_path: str = "/") -> dict[str, dict[str, Any]]:
    spec = WorkspaceSpec(
        id=7,
        name="ws-a",
        namespace="gl-rd-ns-a",
        agent_id=3,
        desired_state="Running",
        actual_state="Starting",
        devfile=parse_devfile(devfile),
        settings=WorkspacesSettings(enabled=True, dns_zone="ws.example.com", network_policy_enabled=False),
        editor_base_path=base_path,
    )
    return {obj["kind"]: obj for obj in resources(spec, Inclusion.PARTIAL)}


def test_the_default_devfile_gets_the_injector_and_the_editor_on_60001() -> None:
    made = objects(DEFAULT_DEVFILE, "/-/workspaces/ws-a/60001/")
    pod = made["Deployment"]["spec"]["template"]["spec"]
    [injector] = pod["initContainers"]
    assert injector["image"] == TOOLS_INJECTOR_IMAGE == TOOLS_IMAGE.reference
    assert injector["volumeMounts"] == [{"name": "gl-workspace-data", "mountPath": DATA_MOUNT}]
    assert injector["securityContext"]["runAsUser"] == 5001 and injector["securityContext"]["runAsNonRoot"]
    [main] = pod["containers"]
    assert TOOLS_DIR == GL_TOOLS_DIR
    assert main["command"] == [f"{TOOLS_DIR}/bin/gl-editor"] and "args" not in main
    assert {"name": "editor-server", "containerPort": EDITOR_PORT, "protocol": "TCP"} in main["ports"]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["GL_EDITOR_BASE_PATH"] == "/-/workspaces/ws-a/60001/" and env["GL_EDITOR_PORT"] == "60001"
    assert main["readinessProbe"]["tcpSocket"] == {"port": EDITOR_PORT}
    service = made["Service"]["spec"]
    assert service["ports"] == [{"name": "editor-server", "port": 60001, "targetPort": 60001, "protocol": "TCP"}]
    assert "clusterIP" not in service


def test_the_containers_own_command_runs_beside_the_editor() -> None:
    main = objects(WITH_COMMAND)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert main["command"] == [f"{TOOLS_DIR}/bin/gl-editor", "--", "sleep", "infinity"] and "args" not in main
    assert [p["containerPort"] for p in main["ports"]] == [8080, EDITOR_PORT]
    assert [p["port"] for p in objects(WITH_COMMAND)["Service"]["spec"]["ports"]] == [8080, EDITOR_PORT]


def test_without_the_attribute_nothing_is_injected() -> None:
    made = objects(PLAIN)
    pod = made["Deployment"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "command" not in pod["containers"][0]
    assert [p["port"] for p in made["Service"]["spec"]["ports"]] == [8080]


@pytest.mark.parametrize(
    ("attributes", "problem"),
    [
        ("{gl/inject-editor: 'yes'}", "must be true or false"),
        ("[1]", "must be a mapping"),
    ],
)
def test_a_bad_attribute_names_the_field(attributes: str, problem: str) -> None:
    text = PLAIN.replace("  - name: dev\n", f"  - name: dev\n    attributes: {attributes}\n")
    with pytest.raises(DevfileError) as caught:
        parse_devfile(text)
    assert caught.value.field.startswith("devfile.components[0].attributes")
    assert problem in caught.value.problem


def test_only_one_component_gets_the_editor() -> None:
    second = "  - name: other\n    attributes: {gl/inject-editor: true}\n    container: {image: alpine:3}\n"
    with pytest.raises(DevfileError, match=r"components\[1\]\.attributes\.gl/inject-editor: only one"):
        parse_devfile(WITH_COMMAND + second)


def test_the_url_names_a_port_the_workspace_serves() -> None:
    assert url_port(parse_devfile(DEFAULT_DEVFILE)) == 60001
    assert url_port(parse_devfile(WITH_COMMAND)) == 60001
    assert url_port(parse_devfile(PLAIN)) == 8080
    assert default_devfile("localhost/tether/busybox:local").endswith('image: "localhost/tether/busybox:local"\n')


def test_kas_is_told_the_editor_port_is_served() -> None:
    assert exposed_ports(Workspace(devfile=DEFAULT_DEVFILE)) == [60001]
    assert exposed_ports(Workspace(devfile=WITH_COMMAND)) == [8080, 60001]
    assert exposed_ports(Workspace(devfile=PLAIN)) == [8080]


def test_the_editor_serves_under_the_path_users_see() -> None:
    assert editor_base_path("ws-a", 60001, None) == "/"
    assert editor_base_path("ws-a", 60001, "http://127.0.0.1:8156/") == "/-/workspaces/ws-a/60001/"
    assert editor_base_path("ws-a", 60001, "https://example.com/kas-ws/") == "/kas-ws/-/workspaces/ws-a/60001/"
    url = address("60001-ws-a", "ws-a", "ws.example.com", "g/p", "https://example.com/kas-ws/")
    assert url.split("?")[0] == "https://example.com" + editor_base_path("ws-a", 60001, "https://example.com/kas-ws/")


def test_a_redirect_within_the_prefix_keeps_it_once() -> None:
    prefix = "/-/workspaces/ws-a/60001"
    for inside in (f"{prefix}/lab?", prefix, f"{prefix}?x=1"):
        assert response_headers({"Location": [inside]}, prefix)["Location"] == [inside]
    assert response_headers({"Location": ["/lab"]}, prefix)["Location"] == [f"{prefix}/lab"]
    # A path that merely starts with the same characters is another path.
    assert response_headers({"Location": [f"{prefix}0/x"]}, prefix)["Location"] == [f"{prefix}{prefix}0/x"]
