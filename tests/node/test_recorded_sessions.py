"""Recorded ``kubectl exec -it`` sessions on a real container (issue 25 item 2).

An agent whose configuration has ``audit: {record_sessions: true}``: a user's interactive shell through kas 1 ->
kas 2 -> agentk -> the real node, driven through a pseudo-terminal, is recorded by kas 1 (WebSocket, kubectl's
default, and SPDY/3.1, its fallback), stored by the hub beside the session's audit event, and replayed in
Chromium by the console with the same text (screenshot saved). Another user with access to the same agent
cannot replay it. A kas whose store deadline the hub cannot meet marks the recording incomplete and the session's
bytes are unaffected.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from tests.console.browser import SCREENSHOTS, chromium_path, new_page, sign_in
from tests.e2e.test_k8s_proxy import proxy_kubeconfig, start_proxied
from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tests.node.test_real_node import READY_S, _pod, apply, kubectl_run
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.redis, pytest.mark.timeout(900)]

WIDTH, HEIGHT = 100, 30
#: The shell prints 42 computed in the container: the text seen is output, not the echo of what was typed.
COMMAND = "echo rec-$((6*7))-done"
MARKER = "rec-42-done"


def exec_in_pty(kc: Kubectl, namespace: str, pod: str, websockets: bool = True, limit_s: float = 120) -> str:
    """``kubectl exec -it <pod> -- sh`` on a pseudo-terminal of WIDTH x HEIGHT: run COMMAND, exit; the output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", HEIGHT, WIDTH, 0, 0))
    env = dict(os.environ, KUBECTL_REMOTE_COMMAND_WEBSOCKETS="true" if websockets else "false", TERM="xterm")
    process = subprocess.Popen(
        [str(kc.binary), f"--kubeconfig={kc.kubeconfig}", f"--cache-dir={kc.kubeconfig.parent / 'kube-cache'}",
         "exec", "-it", "-n", namespace, pod, "--", "sh"],
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + limit_s

    def read_until(text: bytes) -> None:
        while text not in output:
            assert time.monotonic() < deadline, f"no {text!r} from kubectl exec; got {bytes(output)!r}"
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    output.extend(os.read(master, 65536))
                except OSError:  # the terminal closed: kubectl exited
                    break

    try:
        read_until(b"# ")  # busybox sh's root prompt
        os.write(master, COMMAND.encode() + b"\r")
        read_until(MARKER.encode() + b"\r\n")
        os.write(master, b"exit\r")
        assert process.wait(timeout=max(deadline - time.monotonic(), 1)) == 0, bytes(output)
        read_until(b"\x00never")  # drain to EOF
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return output.decode("utf-8", "replace")


async def exec_event(hub: RealHub, agent_id: int, pod: str, count: int = 1) -> list[dict[str, Any]]:
    """The agent's ``exec`` audit events on ``pod`` once ``count`` arrived (kas ships them within seconds)."""
    deadline = time.monotonic() + 90
    while True:
        listed = hub.api().get("/audit_events", params={"agent_id": agent_id, "verb": "exec", "per_page": 100})
        assert listed.status_code == 200, listed.text
        found = [e for e in listed.json() if e["name"] == pod and e["subresource"] == "exec"]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"no exec audit event for {pod}: {listed.json()}"
        await asyncio.sleep(0.5)


def cast_events(content: bytes) -> tuple[dict[str, Any], list[list[Any]]]:
    lines = content.decode().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def replay_in_chromium(base_url: str, login: str, token: str, event_id: str, other: tuple[str, str]) -> str:
    """Sign in, replay the recording to its end, save a screenshot; the other user gets "not found". Returns the
    terminal's text. Runs in a thread of its own: Playwright's sync API wants no asyncio loop in its thread."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = new_page(browser)
            sign_in(page, base_url, login, token)
            page.goto(f"{base_url}/-/audit/{event_id}/recording")
            page.wait_for_selector("#recording-player[data-state=ended]", timeout=60_000)
            text = page.inner_text("#recording-player .ap-term")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "recorded-exec-session.png"), full_page=True)
            intruder = new_page(browser)
            sign_in(intruder, base_url, *other)
            answer = intruder.goto(f"{base_url}/-/audit/{event_id}/recording")
            assert answer is not None and answer.status == 404
            assert intruder.goto(f"{base_url}/-/audit/{event_id}/recording.cast").status == 404  # type: ignore[union-attr]
            return text
        finally:
            browser.close()


async def test_recorded_exec_session_replays_in_the_console(
    k8s_cluster: ClusterInfo, system: System, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    # `system` gives agentk the kubeconfig of `k8s_cluster`, here the real-node cluster (tests/node/conftest.py).
    proxied = await start_proxied(system, kas_hub, kubectl, tmp_path)
    owner_token, other_token = f"glpat-rec-{proxied.agent_id}", f"glpat-rec-other-{proxied.agent_id}"
    kas_hub.grant_proxy_access(other_token, f"rec-other-{proxied.agent_id}", proxied.agent_id, proxied.project_id)
    kas_hub.grant_proxy_access(owner_token, f"rec-user-{proxied.agent_id}", proxied.agent_id, proxied.project_id)
    kas_hub.record_sessions(proxied.agent_id)
    kc = proxied.kubectl(proxied.pat(owner_token), "rec-user", k8s_namespace)
    await apply(kubectl, k8s_namespace, _pod("shell", "exec sleep 3600"))
    await kubectl_run(
        kubectl, "wait", "-n", k8s_namespace, "--for=condition=Ready", "pod/shell", f"--timeout={READY_S}s"
    )

    typed = await asyncio.to_thread(exec_in_pty, kc, k8s_namespace, "shell", True)
    assert MARKER in typed
    [event] = await exec_event(kas_hub, proxied.agent_id, "shell")
    assert event["recording"] == "complete", event
    answer = kas_hub.api(owner_token).get(f"/audit_events/{event['id']}/recording")
    assert answer.status_code == 200 and answer.headers["tether-recording-complete"] == "true"
    header, events = cast_events(answer.content)
    assert (header["version"], header["width"], header["height"]) == (2, WIDTH, HEIGHT)
    output = "".join(data for _, code, data in events if code == "o")
    typed_in = "".join(data for _, code, data in events if code == "i")
    assert MARKER in output and COMMAND in typed_in and "exit" in typed_in
    assert ["r", f"{WIDTH}x{HEIGHT}"] in [[code, data] for _, code, data in events]
    # Another user of the same agent (Developer, not Maintainer) cannot replay it: REST and console.
    assert kas_hub.api(other_token).get(f"/audit_events/{event['id']}/recording").status_code == 404

    shown = await asyncio.to_thread(
        replay_in_chromium,
        kas_hub.url,
        f"rec-user-{proxied.agent_id}",
        owner_token,
        event["id"],
        (f"rec-other-{proxied.agent_id}", other_token),
    )
    assert MARKER in shown, shown

    # SPDY/3.1 (kubectl's fallback): the same session, parsed from its compressed stream headers.
    spdy_typed = await asyncio.to_thread(exec_in_pty, kc, k8s_namespace, "shell", False)
    assert MARKER in spdy_typed
    events_now = await exec_event(kas_hub, proxied.agent_id, "shell", 2)
    [spdy] = [e for e in events_now if e["id"] != event["id"]]
    assert spdy["recording"] == "complete", spdy
    spdy_cast = kas_hub.api().get(f"/audit_events/{spdy['id']}/recording").content
    _, spdy_events = cast_events(spdy_cast)
    assert MARKER in "".join(data for _, code, data in spdy_events if code == "o")
    assert COMMAND in "".join(data for _, code, data in spdy_events if code == "i")


async def test_slow_store_marks_incomplete_and_leaves_the_session_alone(
    k8s_cluster: ClusterInfo, system: System, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    # `system` gives agentk the kubeconfig of `k8s_cluster`, here the real-node cluster (tests/node/conftest.py).
    proxied = await start_proxied(system, kas_hub, kubectl, tmp_path)
    token = f"glpat-rec-slow-{proxied.agent_id}"
    kas_hub.grant_proxy_access(token, f"rec-slow-{proxied.agent_id}", proxied.agent_id, proxied.project_id)
    kas_hub.record_sessions(proxied.agent_id)
    # A kas that gives the hub one millisecond to store a recording: the hub is "slow" for it.
    hasty = system.kas(agent={"kubernetes_api": {"session_recording_store_timeout": "1ms"}})
    kc = Kubectl(
        proxied.binary, proxy_kubeconfig(tmp_path / "hasty.kubeconfig", hasty, proxied.pat(token), k8s_namespace)
    )
    await apply(kubectl, k8s_namespace, _pod("slow", "exec sleep 3600"))
    await kubectl_run(
        kubectl, "wait", "-n", k8s_namespace, "--for=condition=Ready", "pod/slow", f"--timeout={READY_S}s"
    )

    typed = await asyncio.to_thread(exec_in_pty, kc, k8s_namespace, "slow", True)
    assert MARKER in typed  # the session itself went through whole
    [event] = await exec_event(kas_hub, proxied.agent_id, "slow")
    assert event["recording"] == "incomplete", event
    assert event["status"] == 101 and event["bytes_out"] > 0
