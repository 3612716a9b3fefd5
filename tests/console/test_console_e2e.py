"""The console in a real Chromium against the real hub, kas, agentk and cluster (issue 14's acceptance run).

Sign in, create a project and an agent, see agentk connect, create and revoke tokens, save a configuration with
a mistake then fix it, open the live graph (a Deployment, its ReplicaSet and Pods with their arcs), scale the
Deployment with kubectl and see the new Pods without reloading, click a Pod for its details, sign out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.console.browser import new_page, shot, sign_in
from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tests.support.polling import poll_sync
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]

NO_CACHE = {"agent": {"kubernetes_api": {"allowed_agent_cache_ttl": "0s", "allowed_agent_cache_error_ttl": "0s"}}}
NAMESPACE = "console-e2e"


@pytest.fixture
def console_system(
    k8s_cluster: ClusterInfo,
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    tmp_path: Path,
) -> Iterator[tuple[RealHub, KasProc, System]]:
    """A real hub (SQLite) wired to a real kas whose Kubernetes API proxy the hub relays the graph to."""
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server, proxy_tls)  # type: ignore[arg-type]
    try:
        kas = system.kas(**NO_CACHE)
        launcher.start(
            hub,
            {
                "kas.api_address": kas.api_target,
                "kas.k8s_proxy_url": kas.k8s_proxy_url,
                "kas.k8s_proxy_ca_certificate_file": str(proxy_tls.ca_cert),
            },
        )
        yield hub, kas, system
    finally:
        system.stop_all()
        launcher.stop_all()


def vertex(resource: str, name: str, group: str = "", version: str = "v1", namespace: str = NAMESPACE) -> str:
    return f"{group}/{version}/{resource}/{namespace}/{name}"


def graph_ids(page: Page, resource: str) -> list[str]:
    ids: list[str] = page.evaluate("(r) => window.tetherGraph.ids(r)", resource)
    return [i for i in ids if f"/{NAMESPACE}/" in i]


def test_console_end_to_end(
    console_system: tuple[RealHub, KasProc, System], browser: Browser, kubectl: Kubectl
) -> None:
    hub, kas, system = console_system
    _alice_id, alice_token = hub.user("alice", ("api",))
    page = new_page(browser)

    # Sign in.
    page.goto(hub.url + "/")
    expect(page.get_by_role("heading", name="Sign in to Tether")).to_be_visible()
    shot(page, "01-sign-in")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Personal access token").fill("glpat-wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("Invalid login or token.")
    sign_in(page, hub.url, "alice", alice_token)

    # A project and an agent.
    page.get_by_label("Name", exact=True).fill("Demo")
    page.get_by_role("button", name="Create project").click()
    expect(page.get_by_role("heading", name="alice / Demo")).to_be_visible()
    page.get_by_label("Agent name").fill("Bad Name!")
    page.get_by_role("button", name="Register agent").click()
    expect(page.get_by_role("alert")).to_contain_text("name")
    page.get_by_label("Agent name").fill("web-agent")
    page.get_by_role("button", name="Register agent").click()
    expect(page.get_by_role("heading", name="Agent web-agent")).to_be_visible()
    agent_url = page.url
    agent_id = int(agent_url.rstrip("/").rsplit("/", 1)[1])
    expect(page.locator("#connections")).to_contain_text("not connected")

    # Tokens: create one for agentk (shown once), create and revoke another.
    page.get_by_label("New token name").fill("agentk")
    page.get_by_role("button", name="Create token").click()
    agent_token = page.locator("#created-token").inner_text().strip()
    assert agent_token.startswith("glagent-")
    page.get_by_label("New token name").fill("spare")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#token-table")).to_contain_text("spare")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke token spare").click()
    expect(page.locator("#token-table")).not_to_contain_text("spare")
    expect(page.locator("#token-table")).to_contain_text("agentk")
    page.reload()
    expect(page.locator("#created-token")).to_have_count(0)  # shown only once

    # The configuration: a mistake is shown by its line, then the fix is saved.
    page.get_by_label("config.yaml").fill(
        "user_access:\n  access_as:\n    agent: {}\nobservability:\n  logging:\n    levle: debug\n"
    )
    page.get_by_role("button", name="Save configuration").click()
    expect(page.locator("#config-error")).to_contain_text("unknown field")
    expect(page.locator("#config-error-line")).to_contain_text("levle: debug")
    expect(page.locator("#config-error-line")).to_contain_text("line 6")
    shot(page, "04-agent-configuration-error")
    page.get_by_label("config.yaml").fill(
        "user_access:\n  access_as:\n    agent: {}\nobservability:\n  logging:\n    level: debug\n"
    )
    page.get_by_role("button", name="Save configuration").click()
    expect(page.get_by_role("status").filter(has_text="Configuration saved")).to_be_visible()

    # agentk connects; the page shows it without a reload (htmx polls the connections).
    page.evaluate("window.notReloaded = true")
    system.agentk(agent_token, kas, pod_name="agentk-console")
    expect(page.locator("#connection-table")).to_contain_text("agentk-console", timeout=60_000)
    expect(page.locator("#connections")).to_contain_text("connected")
    expect(page.locator("#connection-table .kas-replica")).to_have_text(kas.private_url)
    assert page.evaluate("window.notReloaded") is True
    shot(page, "03-agent")

    # A Deployment in the cluster, drawn in the graph with its ReplicaSet and Pods.
    kubectl.run("create", "namespace", NAMESPACE, check=False)
    kubectl.run("create", "deployment", "web", "--image=registry.invalid/web:1", "--replicas=2", "-n", NAMESPACE)
    page.goto(agent_url + "/graph")
    page.evaluate("window.notReloaded = true")
    deployment = vertex("deployments", "web", "apps")
    poll_sync(
        lambda: len(graph_ids(page, "pods")) == 2 and page.evaluate("(i) => window.tetherGraph.has(i)", deployment),
        "the Deployment and 2 Pods in the graph",
        limit=60,
    )
    replicasets = graph_ids(page, "replicasets")
    assert len(replicasets) == 1, replicasets
    pods = graph_ids(page, "pods")
    assert page.evaluate("([s, d]) => window.tetherGraph.edgesBetween(s, d)", [replicasets[0], deployment]) == ["or"]
    for pod in pods:
        assert page.evaluate("([s, d]) => window.tetherGraph.edgesBetween(s, d)", [pod, replicasets[0]]) == ["or"]
    expect(page.locator("#graph-banner")).to_be_hidden()
    page.get_by_role("button", name="Fit to screen").click()
    shot(page, "05-graph", full_page=False)

    # Scale with kubectl: the new Pods appear without a reload.
    kubectl.run("scale", "deployment", "web", "--replicas=4", "-n", NAMESPACE)
    poll_sync(lambda: len(graph_ids(page, "pods")) == 4, "4 Pods in the graph", limit=60)
    assert page.evaluate("window.notReloaded") is True

    # Click a Pod (a real mouse click on the canvas) for its details.
    pod = graph_ids(page, "pods")[0]
    page.evaluate("(i) => window.tetherGraph.center(i)", pod)
    box = page.locator("#graph-canvas").bounding_box()
    assert box is not None
    where = page.evaluate("(i) => window.tetherGraph.renderedPosition(i)", pod)
    page.mouse.click(box["x"] + where["x"], box["y"] + where["y"])
    details = page.locator("#graph-details")
    expect(details).to_contain_text(pod.rsplit("/", 1)[1])
    expect(details).to_contain_text("Depends on")
    shot(page, "06-graph-pod-details", full_page=False)

    # Keyboard only: find another Pod by name; its details take the focus.
    other = graph_ids(page, "pods")[1].rsplit("/", 1)[1]
    page.get_by_label("Find object").fill(other)
    page.get_by_label("Find object").press("Enter")
    expect(details.get_by_role("heading", name=other)).to_be_visible()
    expect(details).to_be_focused()
    expect(page.get_by_role("button", name="Show everything again")).to_be_hidden()

    # "What this depends on": only the Pod, its ReplicaSet and Deployment (and what else it uses) remain.
    page.evaluate("(i) => window.tetherGraph.select(i)", pod)
    page.get_by_role("button", name="Show what this depends on").click()
    poll_sync(lambda: graph_ids(page, "pods") == [pod], "the graph rooted at the Pod", limit=60)
    assert page.evaluate("(i) => window.tetherGraph.has(i)", deployment)
    page.get_by_role("button", name="Show everything again").click()
    poll_sync(lambda: len(graph_ids(page, "pods")) == 4, "all Pods again", limit=60)

    # The other pages.
    page.goto(hub.url + "/projects")
    shot(page, "02-projects")
    page.goto(hub.url + "/tokens")
    page.get_by_label("Name", exact=True).fill("laptop kubectl")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#created-token")).to_contain_text("glpat-")
    shot(page, "07-tokens")
    page.goto(hub.url + "/workspaces")
    expect(page.locator("#no-workspaces")).to_be_visible()
    expect(page.locator("#no-workspace-agents")).to_be_visible()  # web-agent's configuration has no workspaces

    # Phone width: the agent page still reads in one column.
    phone = page.context.new_page()
    phone.set_viewport_size({"width": 390, "height": 844})
    phone.goto(agent_url)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 400
    shot(phone, "08-agent-phone")
    phone.close()

    # Sign out: back at the form, and the pages need signing in again.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("status")).to_have_text("You are signed out.")
    page.goto(hub.url + "/projects")
    expect(page.get_by_role("heading", name="Sign in to Tether")).to_be_visible()
    page.context.close()
    kubectl.run("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    assert agent_id > 0
