"""The workspace editor end to end on the real node: the stack and the browser steps the test and the bench share.

The stack: the tools-injector image imported into the real node, the real hub (SQLite) with the console, kas with
its workspace listener in the path form (as ``tether up`` serves it), agentk with workspaces enabled on the
real-node cluster. The default devfile's image is the node's busybox: no Python, no Node.js, no editor of its
own, so the editor that loads is the injected one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, expect

from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tests.hub.helpers import Setup, kas_config, project_with_agent
from tests.hub.workspace_helpers import RD_CONFIG
from tests.support.workspace_access import workspaces_section
from tether_devenv.cluster import ClusterInfo
from tether_devenv.node import import_archives
from tether_devenv.oci import BUSYBOX_IMAGE
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer
from tether_devenv.tools_image import build_tools_image

#: Reaching a state through agentk and the real node, on two loaded cores (a first start copies the editor).
STATE_WAIT_MS = 240_000
#: JupyterLab's first page load through kas (some MiB of scripts) on a loaded machine.
EDITOR_WAIT_MS = 120_000


@dataclass
class Stack:
    hub: RealHub
    setup: Setup
    kas_port: int

    @property
    def workspaces_url(self) -> str:
        return f"http://127.0.0.1:{self.kas_port}/"


@contextmanager
def editor_stack(
    directory: Path, cluster: ClusterInfo, kubectl: Kubectl, redis: RedisServer, private_secret_file: Path
) -> Iterator[Stack]:
    """Start the stack on ``cluster`` (a real-node cluster); stop it afterwards."""
    import_archives(cluster.real_nodes, [build_tools_image(progress=lambda _line: None).archive])
    kubectl.run("create", "namespace", "tether-system", check=False)  # agentk's Lease namespace
    directory.mkdir(parents=True, exist_ok=True)
    launcher = HubLauncher(directory, f"sqlite+aiosqlite:///{directory / 'hub.db'}")
    hub = launcher.prepare()
    (directory / "system").mkdir()
    system = System(directory / "system", hub, private_secret_file, cluster.kubeconfig, redis)  # type: ignore[arg-type]
    try:
        port = free_port()
        kas = system.kas(workspaces=workspaces_section(port))
        launcher.start(
            hub,
            {
                "kas.api_address": kas.api_target,
                "kas.workspaces_url": f"http://127.0.0.1:{port}/",
                "workspaces.default_devfile_image": BUSYBOX_IMAGE,
            },
        )
        setup = project_with_agent(hub, roles=("developer",))
        kas_config(hub, setup, RD_CONFIG)
        tokens = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
        system.agentk(hub.api().post(tokens, json={"name": "agentk"}).json()["token"], kas)
        yield Stack(hub, setup, port)
    finally:
        system.stop_all()
        launcher.stop_all()


def row(page: Page, name: str) -> Locator:
    return page.locator(f'#workspace-table tr[data-name="{name}"]')


def expect_state(page: Page, name: str, actual: str) -> None:
    expect(row(page, name)).to_have_attribute("data-actual", actual, timeout=STATE_WAIT_MS)


def create_from_console(page: Page, hub_url: str, name: str) -> float:
    """On the workspaces page, create ``name`` from the form's default devfile; returns the click's time."""
    page.goto(hub_url + "/workspaces")
    page.get_by_label("Name").fill(name)
    assert "gl/inject-editor: true" in page.get_by_label("Devfile", exact=True).input_value()
    clicked = time.monotonic()
    page.get_by_role("button", name="Create workspace").click()
    return clicked


def open_link(page: Page, name: str) -> str:
    link = page.get_by_role("link", name=f"Open workspace {name}")
    expect(link).to_be_visible(timeout=STATE_WAIT_MS)
    return link.get_attribute("href") or ""


def open_editor(page: Page, url: str) -> None:
    """Load the editor (kas signs the browser in through the hub on the first visit) until its shell shows."""
    page.goto(url)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=EDITOR_WAIT_MS)


#: In the page: a terminal of the editor over its WebSocket through kas. Runs a command (output both ways), then
#: times ``samples`` keystrokes from send to their echo.
_TERMINAL_JS = """async ({base, samples}) => {
  const xsrf = decodeURIComponent((document.cookie.match(/(?:^|; )_xsrf=([^;]+)/) || [, ""])[1]);
  const headers = {"X-XSRFToken": xsrf};
  const made = await fetch(base + "api/terminals", {method: "POST", headers});
  if (!made.ok) throw new Error("terminal not created: " + made.status);
  const name = (await made.json()).name;
  const ws = new WebSocket(base.replace(/^http/, "ws") + "terminals/websocket/" + name);
  await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = () => bad(new Error("WebSocket refused")); });
  let seen = "";
  let check = null;
  ws.onmessage = (e) => { const m = JSON.parse(e.data); if (m[0] === "stdout") { seen += m[1]; if (check) check(); } };
  const waitFor = (text, ms) => new Promise((ok, bad) => {
    const late = () => bad(new Error("no " + JSON.stringify(text) + " in " + JSON.stringify(seen.slice(-300))));
    const timer = setTimeout(late, ms);
    check = () => { if (seen.includes(text)) { clearTimeout(timer); check = null; ok(); } };
    check();
  });
  ws.send(JSON.stringify(["stdin", "echo $((6*7))-through-kas\\r"]));
  await waitFor("42-through-kas", 60000);
  const times = [];
  for (let i = 0; i < samples; i++) {
    const key = "abcdefghijklmnopqrstuvwxyz"[i % 26];
    seen = "";
    const sent = performance.now();
    ws.send(JSON.stringify(["stdin", key]));
    await waitFor(key, 10000);
    times.push(performance.now() - sent);
  }
  ws.send(JSON.stringify(["stdin", "\\u0015exit\\r"]));
  ws.close();
  await fetch(base + "api/terminals/" + name, {method: "DELETE", headers});
  return times;
}"""


def terminal_round_trips(page: Page, base: str, samples: int) -> list[float]:
    """Run a command in a new terminal of the editor at ``base`` and time ``samples`` keystroke echoes (ms)."""
    result: Any = page.evaluate(_TERMINAL_JS, {"base": base, "samples": samples})
    return [float(x) for x in json.loads(json.dumps(result))]
