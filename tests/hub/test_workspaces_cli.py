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


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_workspace_cli_polish(hub: RealHub, tmp_path: Path) -> None:
    """Issue 23 item 5: full names when piped, validated states, one refusal wording, scope errors name the scope."""
    ws = workspace_setup(hub)
    token = ws.setup.tokens["developer"]
    long_name = "a-workspace-name-long-enough-to-be-cut-when-piped1"  # 50: its namespace takes 63
    created = run(
        hub, token, "create", "--agent", str(ws.setup.agent_id), "--project", str(ws.setup.project_id),
        "--name", long_name, "--output", "json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    number = json.loads(created.stdout)["id"].rsplit("/", 1)[1]

    # Piped (capture_output): the whole name on one line, whatever the columns.
    listed = run(hub, token, "list")
    assert listed.returncode == 0 and any(long_name in line for line in listed.stdout.splitlines()), listed.stdout

    # States in any case; an unknown state is refused with the list instead of listing nothing.
    lower = run(hub, token, "list", "--state", "creationrequested", "--output", "json")
    assert [n["name"] for n in json.loads(lower.stdout)] == [long_name]
    assert json.loads(run(hub, token, "list", "--state", "FAILED", "--output", "json").stdout) == []
    bogus = run(hub, token, "list", "--state", "borked")
    assert bogus.returncode == 2 and "'borked': not one of" in bogus.stderr and "Running" in bogus.stderr

    # Someone else's workspace: show and stop refuse in the same words.
    outsider = ws.setup.tokens["maintainer"]
    refusals = [run(hub, outsider, command, number) for command in ("show", "stop")]
    assert [r.returncode for r in refusals] == [1, 1]
    assert refusals[0].stderr == refusals[1].stderr, refusals
    assert f"workspace {number} does not exist or you don't have permission" in refusals[0].stderr
    assert run(hub, token, "show", "999999").stderr.replace("999999", number) == refusals[0].stderr

    # A read_api token may read its own workspace but is told which scope a change needs.
    read_only = hub.token_for(ws.setup.user_ids["developer"], ("read_api",))
    assert run(hub, read_only, "show", number).returncode == 0
    refused = run(hub, read_only, "stop", number)
    assert refused.returncode == 1 and "api scope" in refused.stderr, refused.stderr


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_workspace_cli_wait_gives_up_with_the_state(hub: RealHub) -> None:
    """No agentk reconciles here: ``--wait`` prints the state and gives up after ``--timeout`` with exit 1."""
    ws = workspace_setup(hub)
    result = run(
        hub, ws.setup.tokens["developer"], "create", "--agent", str(ws.setup.agent_id),
        "--project", str(ws.setup.project_id), "--name", "waits", "--wait", "--timeout", "2",
    )  # fmt: skip
    assert result.returncode == 1
    assert "waits: CreationRequested" in result.stdout
    assert "still CreationRequested after 2 s (waiting for Running)" in result.stderr


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_workspace_cli_wait_gives_a_failure_from_before_the_request_time_to_clear(hub: RealHub) -> None:
    """An Error the workspace was in before ``start --wait`` may clear at the next partial reconciliation (the
    hub retries it): it does not end the wait at once; the give-up message keeps its reason."""
    ws = workspace_setup(hub)
    token = ws.setup.tokens["developer"]
    args = ("create", "--agent", str(ws.setup.agent_id), "--project", str(ws.setup.project_id), "--name", "stale")
    created = run(hub, token, *args, "--output", "json")
    number = json.loads(created.stdout)["id"].rsplit("/", 1)[1]
    hub.db.execute(
        "UPDATE workspaces SET actual_state = 'Error', actual_state_message = 'quota exceeded' WHERE id = :i",
        i=int(number),
    )
    result = run(hub, token, "start", number, "--wait", "--timeout", "2")
    assert result.returncode == 1 and "stale: Error (quota exceeded)" in result.stdout, result
    assert "stale is still Error after 2 s (waiting for Running): quota exceeded" in result.stderr, result.stderr
