"""The workspaces page and the agent page's kas replicas in a real Chromium, against the real hub, two kas, two
agentk and the cluster (issue 14, Deliver items 2 and 4).

A developer creates a workspace from a devfile in the page and watches agentk (``remote_development``, through
kas) bring it to Running without reloading; stops, starts, restarts and terminates it with the page's buttons;
another user neither sees nor changes it; a request without the CSRF token changes nothing. The agent page names
the kas replica that holds each agentk connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.console.browser import new_page, shot, sign_in
from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.k8s import ClusterInfo, Kubectl
from tests.fixtures.system import KasProc, System
from tests.hub.helpers import Setup, kas_config, project_with_agent
from tests.hub.workspace_helpers import DEVFILE, RD_CONFIG, volumes
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]

#: Where the hub says kas' workspace listener is (the path form); the test only checks the link.
WORKSPACES_URL = "http://127.0.0.1:8156/"
#: A workspace may take this long to reach a state through agentk and the cluster on a loaded machine.
STATE_WAIT_MS = 120_000


@dataclass
class Env:
    hub: RealHub
    kas: list[KasProc]
    setup: Setup


@pytest.fixture
def env(
    tmp_path: Path, k8s_cluster: ClusterInfo, kubectl: Kubectl, redis_server: RedisServer, private_secret_file: Path
) -> Iterator[Env]:
    """A hub on SQLite, two kas replicas on one Redis, and agentk pods of one agent on each replica."""
    kubectl.run("create", "namespace", "tether-system", check=False)
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server)  # type: ignore[arg-type]
    try:
        first, second = system.kas(), system.kas()
        launcher.start(hub, {"kas.api_address": first.api_target, "kas.workspaces_url": WORKSPACES_URL})
        setup = project_with_agent(hub, roles=("developer",))
        kas_config(hub, setup, RD_CONFIG)
        tokens = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
        agent_token = hub.api().post(tokens, json={"name": "agentk"}).json()["token"]
        system.agentk(agent_token, first, pod_name="agentk-on-kas1")
        system.agentk(agent_token, second, pod_name="agentk-on-kas2")
        yield Env(hub, [first, second], setup)
    finally:
        system.stop_all()
        launcher.stop_all()


def row(page: Page, name: str) -> Locator:
    return page.locator(f'#workspace-table tr[data-name="{name}"]')


def expect_state(page: Page, name: str, actual: str, desired: str | None = None) -> None:
    expect(row(page, name)).to_have_attribute("data-actual", actual, timeout=STATE_WAIT_MS)
    expect(row(page, name).locator(".badge")).to_have_text(actual)
    if desired is not None:
        expect(row(page, name)).to_have_attribute("data-desired", desired, timeout=STATE_WAIT_MS)


def test_workspaces_page_end_to_end(env: Env, browser: Browser, kubectl: Kubectl) -> None:
    volumes(kubectl, 1)
    page = new_page(browser)
    sign_in(page, env.hub.url, "developer", env.setup.tokens["developer"])
    page.get_by_role("link", name="Workspaces").click()
    expect(page.get_by_role("heading", name="Workspaces", exact=True)).to_be_visible()
    expect(page.locator("#no-workspaces")).to_be_visible()

    # HTML in a name comes back as text in the error, and nothing is created.
    page.get_by_label("Name").fill("<b>bold</b>")
    page.get_by_role("button", name="Create workspace").click()
    expect(page.get_by_role("alert")).to_contain_text("'<b>bold</b>' is not a DNS label")
    expect(page.locator("#create b")).to_have_count(0)

    # Create from a devfile; the list follows the states without a reload.
    page.get_by_label("Name").fill("console-ws")
    page.get_by_label("Devfile", exact=True).fill(DEVFILE)
    page.get_by_role("button", name="Create workspace").click()
    expect(row(page, "console-ws")).to_be_visible()
    page.evaluate("window.notReloaded = true")
    expect(row(page, "console-ws")).to_have_attribute("data-desired", "Running")
    open_link = page.get_by_role("link", name="Open workspace console-ws")
    expect_state(page, "console-ws", "Running")
    expect(row(page, "console-ws").locator(".badge")).to_have_class(re.compile(r"\bok\b"))
    ws_id = int((row(page, "console-ws").get_attribute("id") or "").rsplit("-", 1)[1])
    assert open_link.get_attribute("href") == (
        f"{WORKSPACES_URL}-/workspaces/console-ws/8080/?folder=%2Fprojects%2Fplatform%2Fclusters"
    )
    assert page.evaluate("window.notReloaded") is True
    shot(page, "09-workspaces")
    phone = page.context.new_page()
    phone.set_viewport_size({"width": 390, "height": 844})
    phone.goto(env.hub.url + "/workspaces")
    expect(row(phone, "console-ws")).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 400
    phone.close()

    # Stop, start, restart: each button asks for a desired state, agentk brings the actual state there.
    page.get_by_role("button", name="Stop workspace console-ws").click()
    expect(row(page, "console-ws")).to_have_attribute("data-desired", "Stopped")
    expect(open_link).to_have_count(0)
    expect_state(page, "console-ws", "Stopped")
    page.get_by_role("button", name="Start workspace console-ws").click()
    expect_state(page, "console-ws", "Running", desired="Running")
    page.get_by_role("button", name="Restart workspace console-ws").click()
    expect_state(page, "console-ws", "Running", desired="Running")

    # A request without the session's CSRF token is refused, even with the session cookie.
    refused = page.request.post(f"{env.hub.url}/workspaces/{ws_id}/state", form={"desired_state": "Stopped"})
    assert refused.status == 403
    expect(row(page, "console-ws")).to_have_attribute("data-desired", "Running")

    # Another user: not listed, and its buttons' requests are "not found".
    other = new_page(browser)
    sign_in(other, env.hub.url, "outsider", env.setup.tokens["outsider"])
    other.goto(env.hub.url + "/workspaces")
    expect(other.locator("#no-workspaces")).to_be_visible()
    csrf = other.locator('meta[name="csrf-token"]').get_attribute("content") or ""
    stolen = other.request.post(
        f"{env.hub.url}/workspaces/{ws_id}/state", form={"desired_state": "Terminated", "authenticity_token": csrf}
    )
    assert stolen.status == 404 and "console-ws" not in stolen.text()
    other.context.close()
    expect(row(page, "console-ws")).to_have_attribute("data-desired", "Running")

    # Terminate (after a confirmation): final, no buttons left.
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Terminate workspace console-ws").click()
    expect(row(page, "console-ws")).to_have_attribute("data-desired", "Terminated")
    expect_state(page, "console-ws", "Terminated")
    expect(row(page, "console-ws").get_by_role("button")).to_have_count(0)
    page.context.close()


def test_agent_page_names_the_kas_replica_of_each_connection(env: Env, browser: Browser) -> None:
    page = new_page(browser)
    sign_in(page, env.hub.url, "developer", env.setup.tokens["developer"])
    page.goto(f"{env.hub.url}/projects/{env.setup.project_id}/agents/{env.setup.agent_id}")
    table = page.locator("#connection-table")
    for pod, kas in (("agentk-on-kas1", env.kas[0]), ("agentk-on-kas2", env.kas[1])):
        line = table.locator("tr", has_text=pod)
        expect(line).to_be_visible(timeout=60_000)
        expect(line.locator(".kas-replica")).to_have_text(kas.private_url)
    assert env.kas[0].private_url != env.kas[1].private_url
    shot(page, "10-agent-kas-replicas")
    page.context.close()
