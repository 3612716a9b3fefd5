"""A person uses a workspace through the console and its injected editor, on the real node (issue 23 acceptance).

In Chromium, the developer creates a workspace from the console's default devfile (its image, busybox, has no
editor, no Python and no Node.js: the editor is the one the tools injector copies into the volume), waits for
Running, opens the editor through kas (the path form ``tether up`` serves; kas signs the browser in through the
hub), opens a file of the workspace's volume, edits and saves it, runs a command in a terminal (its WebSocket
through kas both ways), stops and starts the workspace and finds the edit, then terminates it. The console's
Open link is the URL GraphQL gives. Screenshots go to ``$TETHER_ARTEFACTS/workspace-editor`` (``.ci/run`` keeps
``build/artefacts``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.console.browser import new_page, sign_in
from tests.fixtures.k8s import Kubectl
from tests.hub.workspace_helpers import graphql
from tests.node.editor_stack import (
    EDITOR_WAIT_MS,
    Stack,
    create_from_console,
    editor_stack,
    expect_state,
    open_editor,
    open_link,
    row,
    terminal_round_trips,
)
from tether_devenv.cluster import ClusterInfo
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = Path(os.environ.get("TETHER_ARTEFACTS", ROOT / "build" / "artefacts")) / "workspace-editor"
NAME = "editor-ws"
EDIT = "edited-in-the-browser"
#: The default devfile's container.
CONTAINER = "development-environment"


@pytest.fixture
def stack(
    tmp_path: Path,
    real_node_cluster: ClusterInfo,
    kubectl: Kubectl,
    redis_server: RedisServer,
    private_secret_file: Path,
) -> Iterator[Stack]:
    with editor_stack(tmp_path, real_node_cluster, kubectl, redis_server, private_secret_file) as started:
        yield started


def shot(page: Page, name: str) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / f"{name}.png"))


def in_volume(kubectl: Kubectl, namespace: str, *command: str, check: bool = True) -> str:
    """Run ``command`` in the workspace's container (the default devfile's only one); its standard output."""
    where = ("exec", "-n", namespace, f"deploy/{NAME}", "-c", "development-environment", "--")
    return kubectl.run(*where, *command, check=check).stdout


def wait_for(check: object, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(1)
    pytest.fail(f"timed out after {limit_s}s waiting for {what}")


def typed_in_terminal(kubectl: Kubectl, namespace: str, limit_s: float = 30) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if "typed-in-the-terminal" in in_volume(kubectl, namespace, "cat", "/projects/terminal.txt", check=False):
            return True
        time.sleep(1)
    return False


def edit_and_save(page: Page, base: str, file: str) -> None:
    page.goto(f"{base}lab/tree/{file}")
    content = page.locator(".jp-FileEditor:visible .cm-content")
    expect(content).to_contain_text("written by kubectl", timeout=EDITOR_WAIT_MS)
    content.click()
    page.keyboard.press("Control+End")
    page.keyboard.type(f" {EDIT}")
    page.keyboard.press("Control+s")


def test_a_workspace_from_the_console_default_devfile_with_its_editor(
    stack: Stack, browser: Browser, kubectl: Kubectl
) -> None:
    page = new_page(browser)
    page.on("dialog", lambda dialog: dialog.accept())  # the Terminate button asks first
    sign_in(page, stack.hub.url, "developer", stack.setup.tokens["developer"])
    create_from_console(page, stack.hub.url, NAME)
    expect_state(page, NAME, "Running")
    url = open_link(page, NAME)
    base = url.split("?", 1)[0]
    assert base == f"{stack.workspaces_url}-/workspaces/{NAME}/60001/"
    query = "query { workspaces { nodes { name namespace url } } }"
    [listed] = graphql(stack.hub, stack.setup.tokens["developer"], query).json()["data"]["workspaces"]["nodes"]
    assert listed["url"] == url  # the console's Open link is GraphQL's (and so the CLI's) URL
    namespace = listed["namespace"]
    shot(page, "01-console-running")

    # The image has no editor: the injected one answers, signed in through the hub on the way.
    assert "No such file" in kubectl.run(
        "exec", "-n", namespace, f"deploy/{NAME}", "-c", CONTAINER, "--", "ls", "/usr/bin/python3",
        check=False,
    ).stderr  # fmt: skip
    in_volume(kubectl, namespace, "sh", "-c", "echo 'written by kubectl' > /projects/notes.txt")
    editor = page.context.new_page()
    open_editor(editor, url)
    expect(editor.locator(".jp-DirListing-item", has_text="notes.txt")).to_be_visible(timeout=EDITOR_WAIT_MS)
    shot(editor, "02-editor")

    edit_and_save(editor, base, "notes.txt")
    saved = "/projects/notes.txt"
    wait_for(lambda: EDIT in in_volume(kubectl, namespace, "cat", saved, check=False), 60, "the saved edit")
    shot(editor, "03-file-saved")

    # A terminal of the editor: a command and its output over the WebSocket through kas.
    assert len(terminal_round_trips(editor, base, samples=3)) == 3
    editor.get_by_role("menuitem", name="File", exact=True).click()
    editor.locator('li.lm-Menu-item[data-type="submenu"]', has_text="New").first.click()
    editor.locator('li.lm-Menu-item[data-command="terminal:create-new"]').click()
    terminal = editor.locator(".jp-Terminal .xterm")
    expect(terminal).to_be_visible(timeout=EDITOR_WAIT_MS)
    # Keys typed before the terminal's WebSocket is open are lost: type again until the command has run.
    for _attempt in range(4):
        terminal.click()
        editor.keyboard.type("echo typed-in-the-terminal > /projects/terminal.txt\n")
        if typed_in_terminal(kubectl, namespace):
            break
    assert typed_in_terminal(kubectl, namespace), "the command typed in the terminal never ran"
    shot(editor, "04-terminal")

    # Stop, start: the volume keeps the edit, the editor comes back.
    page.bring_to_front()
    page.get_by_role("button", name=f"Stop workspace {NAME}").click()
    expect_state(page, NAME, "Stopped")
    page.get_by_role("button", name=f"Start workspace {NAME}").click()
    expect_state(page, NAME, "Running")
    open_editor(editor, url)
    editor.goto(f"{base}lab/tree/notes.txt")
    expect(editor.locator(".jp-FileEditor:visible .cm-content")).to_contain_text(EDIT, timeout=EDITOR_WAIT_MS)
    shot(editor, "05-edit-kept-after-restart")

    # Terminate: the workspace's objects go, and the editor with them.
    page.bring_to_front()
    page.get_by_role("button", name=f"Terminate workspace {NAME}").click()
    expect_state(page, NAME, "Terminated")
    expect(row(page, NAME).get_by_role("link")).to_have_count(0)
    shot(page, "06-terminated")
    wait_for(
        lambda: not kubectl.run("get", "deployment", "-n", namespace, "-o", "name").stdout.strip(),
        120,
        "the Deployment to be deleted",
    )
    gone = editor.goto(url)
    assert gone is not None and gone.status >= 400
    kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
