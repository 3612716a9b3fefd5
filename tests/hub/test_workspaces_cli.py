"""``tether workspace ...`` against a real hub, run as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.hub import RealHub
from tests.hub.workspace_helpers import DEVFILE, workspace_setup

TETHER = str(Path(sys.executable).with_name("tether"))


def run(hub: RealHub, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_HUB_URL": hub.url, "TETHER_PAT": token}
    return subprocess.run(
        [TETHER, "workspace", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_workspace_cli_round_trip(hub: RealHub, tmp_path: Path) -> None:
    ws = workspace_setup(hub)
    devfile = tmp_path / "devfile.yaml"
    devfile.write_text(DEVFILE)
    token = ws.setup.tokens["developer"]
    created = run(
        hub, token, "create", "--agent", str(ws.setup.agent_id), "--project", str(ws.setup.project_id),
        "--devfile", str(devfile), "--name", "my-ws", "--output", "json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    workspace = json.loads(created.stdout)
    assert workspace["name"] == "my-ws" and workspace["actualState"] == "CreationRequested"
    number = workspace["id"].rsplit("/", 1)[1]

    listed = run(hub, token, "list", "--output", "json")
    assert [n["name"] for n in json.loads(listed.stdout)] == ["my-ws"]
    assert "my-ws" in run(hub, token, "list").stdout
    assert "CreationRequested" in run(hub, token, "show", number).stdout
    for command, desired in (("stop", "Stopped"), ("start", "Running"), ("restart", "RestartRequested")):
        result = run(hub, token, command, number)
        assert result.returncode == 0 and f"desired {desired}" in result.stdout, result.stderr

    # Someone else's workspace: a clear error, nothing changed.
    other = run(hub, ws.setup.tokens["maintainer"], "terminate", number)
    assert other.returncode == 1 and "does not exist or you don't have permission" in other.stderr
    assert run(hub, ws.setup.tokens["maintainer"], "show", number).returncode == 1

    assert run(hub, token, "terminate", number).returncode == 0
    again = run(hub, token, "start", number)
    assert again.returncode == 1 and "cannot be updated. Create a new workspace instead." in again.stderr

    bad = run(
        hub,
        token,
        "create",
        "--agent",
        str(ws.setup.agent_id),
        "--project",
        str(ws.setup.project_id),
        "--name",
        "Bad_Name",
    )
    assert bad.returncode == 1 and "name: 'Bad_Name' is not a DNS label" in bad.stderr
    assert run(hub, "wrong-token", "list").returncode == 1
    assert "refused the token" in run(hub, "wrong-token", "list").stderr
