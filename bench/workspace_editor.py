"""Benchmark the injected workspace editor on the real node (issue 23 acceptance figures).

Usage: ``.venv/bin/python bench/workspace_editor.py [--samples 3] [--keystrokes 50]`` (as root: the real node).

Set-up (``tests/node/editor_stack.py``, the browser test's): a cluster with a real node, the tools-injector
image and busybox already on the node, the real hub and console, kas serving workspaces in the path form, agentk;
Debian's Chromium driven by Playwright, signed in as the developer.

* ``create_to_editor_ready_seconds`` (p50 of ``--samples``): the console's "Create workspace" click (default
  devfile) -> the workspace Running -> its Open link followed through kas (sign-in through the hub on the first
  visit) -> JupyterLab's main area shown. Each sample is a new workspace, so the injector copies the editor into
  a new volume each time; each is terminated afterwards.
* ``editor_keystroke_echo_ms`` (p50 of ``--keystrokes``): in the editor's page, one character sent to a terminal
  over its WebSocket through kas -> the shell's echo received back.

Merges both figures into ``bench/results/workspaces.json`` (the other figures there are left as they are).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.console.browser import chromium_path, new_page, sign_in
from tests.fixtures.k8s import Kubectl, cluster_assets
from tests.fixtures.system import write_private_secret
from tests.hub.workspace_helpers import graphql
from tests.node.editor_stack import (
    create_from_console,
    editor_stack,
    expect_state,
    open_editor,
    open_link,
    terminal_round_trips,
)
from tether_devenv.cluster import LocalCluster
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "workspaces.json"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    executable = chromium_path()
    if executable is None:
        raise SystemExit("Debian's chromium is needed (scripts/bootstrap.sh installs it)")
    ready: list[float] = []
    echoes: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tether-editor-bench-") as tmp:
        directory = Path(tmp)
        cluster = LocalCluster(directory / "cluster", nodes=1, real_nodes=1)
        info = cluster.start()
        redis = RedisServer(directory / "redis")
        redis.start()
        kubectl = Kubectl(cluster_assets()["kubectl"], info.kubeconfig)
        secret = write_private_secret(directory / "private_secret")
        try:
            with (
                editor_stack(directory / "stack", info, kubectl, redis, secret) as stack,
                sync_playwright() as playwright,
            ):
                browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
                page = new_page(browser)
                page.on("dialog", lambda dialog: dialog.accept())
                sign_in(page, stack.hub.url, "developer", stack.setup.tokens["developer"])
                for sample in range(args.samples):
                    name = f"bench-{sample}"
                    clicked = create_from_console(page, stack.hub.url, name)
                    url = open_link(page, name)
                    editor = page.context.new_page()
                    open_editor(editor, url)
                    ready.append(time.monotonic() - clicked)
                    print(f"{name}: editor ready {ready[-1]:.1f} s after the click")
                    if sample == 0:
                        echoes = terminal_round_trips(editor, url.split("?", 1)[0], args.keystrokes)
                        print(f"keystroke echo p50 {statistics.median(echoes):.1f} ms (n={len(echoes)})")
                    editor.close()
                    page.get_by_role("button", name=f"Terminate workspace {name}").click()
                    expect_state(page, name, "Terminated")
                query = "query { workspaces { nodes { namespace } } }"
                for node in graphql(stack.hub, stack.setup.tokens["developer"], query).json()["data"]["workspaces"][
                    "nodes"
                ]:
                    kubectl.run("delete", "namespace", node["namespace"], "--wait=false", check=False)
                browser.close()
        finally:
            redis.stop()
            cluster.stop()
    print(f"create -> editor ready: {[round(r, 1) for r in ready]} s")
    return [
        {"metric": "create_to_editor_ready_seconds", "value": round(statistics.median(ready), 1), "unit": "s"},
        {"metric": "editor_keystroke_echo_ms", "value": round(statistics.median(echoes), 1), "unit": "ms"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--keystrokes", type=int, default=50)
    args = parser.parse_args()
    load = os.getloadavg()
    figures = run(args)
    print(f"load average before: {load[0]:.2f}, after: {os.getloadavg()[0]:.2f}")
    names = {f["metric"] for f in figures}
    kept = [f for f in json.loads(RESULTS.read_text()) if f["metric"] not in names] if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*kept, *figures], indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
