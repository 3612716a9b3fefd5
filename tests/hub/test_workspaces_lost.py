"""A cluster replaced by an empty one: its agent's workspaces become Terminated with the reason (issue 23 item 1).

`tether up` recreates its cluster on every start and runs `tether hub agent workspaces-lost` for its agent.
Before, the hub kept listing those workspaces Running, and agentk's next full reconciliation was sent them to
create again, with empty volumes. A workspace already Terminated keeps its own reason; the rows stay.
"""

from __future__ import annotations

import os
import subprocess

from tests.fixtures.hub import RealHub
from tests.fixtures.system import TETHER
from tests.hub.workspace_helpers import LIST, create, graphql, reconcile, workspace_setup

REASON = "lost: the cluster was replaced"


def _lost(hub: RealHub, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TETHER_HUB_DATABASE_URL=hub.db.url)
    command = [TETHER, "hub", "agent", "workspaces-lost", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_workspaces_of_a_replaced_cluster_are_terminated_with_the_reason_and_never_sent_again(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    running = create(hub, ws, name="ws-running")
    gone = create(hub, ws, name="ws-gone")
    hub.db.execute(
        "UPDATE workspaces SET desired_state = 'Terminated', actual_state = 'Terminated', "
        "actual_state_message = 'terminated by its owner' WHERE name = 'ws-gone'"
    )

    result = _lost(hub, "platform/clusters", "production", "--reason", REASON)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ws-running"]

    listing = graphql(hub, ws.setup.tokens["developer"], LIST).json()["data"]["workspaces"]["nodes"]
    states = {w["name"]: (w["desiredState"], w["actualState"], w["actualStateMessage"]) for w in listing}
    assert states == {
        "ws-running": ("Terminated", "Terminated", REASON),
        "ws-gone": ("Terminated", "Terminated", "terminated by its owner"),
    }
    # agentk's first full reconciliation in the new cluster: nothing to create again.
    full = reconcile(hub, ws, {"update_type": "full", "workspace_agent_infos": []})
    assert full.status_code == 201, full.text
    assert [i["name"] for i in full.json()["workspace_rails_infos"]] == []
    assert running["name"] == "ws-running" and gone["name"] == "ws-gone"


def test_a_lost_mark_needs_a_reason_and_an_existing_agent(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    create(hub, ws, name="ws-kept")
    empty = _lost(hub, "platform/clusters", "production", "--reason", "  ")
    assert empty.returncode != 0 and "must not be empty" in empty.stderr
    unknown = _lost(hub, "platform/clusters", "staging", "--reason", REASON)
    assert unknown.returncode != 0 and "Agent" in unknown.stderr
    assert hub.db.rows("SELECT actual_state FROM workspaces WHERE name = 'ws-kept'") == [
        {"actual_state": "CreationRequested"}
    ]
