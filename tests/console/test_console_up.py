"""`tether up` (what `make up` runs) prints the console's address first, and its printed token signs in there.

Then the whole path a user takes: the demo agent shows as connected, and a Deployment created with kubectl
through kas appears in the graph, which the hub relays to kas' TLS proxy with the CA `tether up` made.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.console.browser import new_page, shot, sign_in
from tests.fixtures.system import TETHER
from tests.support.polling import poll_sync
from tether_devenv.assets import AssetsMissing, locate

pytestmark = pytest.mark.k8s


def test_make_up_prints_the_console_first_and_its_token_signs_in(tmp_path: Path, browser: Browser) -> None:
    try:
        kubectl = locate()["kubectl"]
    except AssetsMissing as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    log_path = tmp_path / "up.log"
    with log_path.open("w+") as log:
        up = subprocess.Popen(
            # kwok nodes and agentk on the host (named agentk-local): the console is what this test is about.
            [TETHER, "up", "--kwok-only", "--state-dir", str(tmp_path / "state")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        poll_sync(lambda: up.poll() is None and "Press Ctrl-C to stop." in log_path.read_text(), "tether up", 180)
        output = log_path.read_text()
        # What `tether up` shows once everything runs: a blank line, then "label: value" lines.
        summary = output.split("\nPress Ctrl-C to stop.")[0].rsplit("\n\n", 1)[1].splitlines()
        assert summary[0].startswith("console:"), output
        found = re.match(r"console:\s+(http://\S+)/\s+\(sign in as root with the token (glpat-\S+)\)", summary[0])
        assert found is not None, summary[0]
        console_url, token = found.groups()
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", output)
        assert kubeconfig is not None

        page = new_page(browser)
        sign_in(page, console_url, "root", token)
        page.get_by_role("link", name="Administrator / tether-demo").click()
        page.get_by_role("link", name="local").click()
        expect(page.locator("#connections")).to_contain_text("agentk-local", timeout=30_000)
        expect(page.locator("#kubeconfig")).to_contain_text("https://127.0.0.1:8154/k8s-proxy/")

        subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig[1]}", "create", "deployment", "hello", "--image=x/hello:1"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        page.get_by_role("link", name="Open the live cluster graph").click()
        poll_sync(
            lambda: page.evaluate(
                "() => window.tetherGraph && window.tetherGraph.has('apps/v1/deployments/default/hello')"
            ),
            "the Deployment in the graph",
            60,
        )
        shot(page, "09-make-up-graph", full_page=False)
        page.context.close()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
