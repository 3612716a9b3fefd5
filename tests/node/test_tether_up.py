"""`make up` (`tether up`) on its default real node: agentk from its chart, real containers, workspaces.

One `tether up` run for the module (a real node, the agentk image, helm; about a minute), then a restart of
it with the same state directory, as a user's second `make up` (issues 22 item 5 and 23 item 1):

- agentk runs in the cluster as the chart deploys it (two pods, one leader holding the Lease), connected
  to kas on the host through the node's veth;
- the printed command runs a real container and `kubectl exec`s into it through kas;
- the printed `tether workspace create` reaches Running on the real node, with a volume;
- after the restart (a new cluster) the workspace is Terminated with the reason and where its data went,
  the data itself is there, and the agent configuration the user edited is kept.

`tether up` starts its own cluster (not this package's `real_node_cluster`): starting one is what it does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.fixtures.k8s import Kubectl, cluster_assets
from tests.fixtures.system import TETHER
from tests.support.polling import poll_sync
from tether_devenv.oci import WORKSPACE_IMAGE
from tether_devenv.process import pid_alive
from tether_devenv.up import HUB_PORT, KAS_PORTS

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

#: A start builds the agentk image when the sources changed (~20-40 s on two loaded cores) and pulls nothing.
START_S = 420
HUB = f"http://127.0.0.1:{HUB_PORT}"


@dataclass
class Up:
    """One `tether up` process and what it printed."""

    state: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log: IO[str] | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> str:
        """Start `tether up` and wait until it says everything runs; return its output so far."""
        self.log_path.write_text("")
        self.log = self.log_path.open("a")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self.process = subprocess.Popen(
            [TETHER, "up", "--state-dir", str(self.state)], stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        process = self.process

        def ready() -> bool:
            assert process.poll() is None, self.log_path.read_text()
            return "Press Ctrl-C to stop." in self.log_path.read_text()

        poll_sync(ready, "tether up printing how to reach everything", START_S, 0.5)
        output = self.log_path.read_text()
        self.pids += [int(p) for p in re.findall(r"pid (\d+)", output)]
        return output

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; then every process it started must be gone."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=120)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            if self.log is not None:
                self.log.close()
            self.process = None
        poll_sync(lambda: not any(pid_alive(p) for p in self.pids), "tether up's processes gone", 30, 0.2)

    def line(self, output: str, label: str) -> str:
        """The value printed after ``label:`` (the summary's "label: value" lines)."""
        found = re.search(rf"^{re.escape(label)}:\s+(.+)$", output, re.MULTILINE)
        assert found is not None, f"no {label!r} line in:\n{output}"
        return found[1].strip()

    def admin(self) -> Kubectl:
        """Cluster-admin kubectl of the cluster `tether up` started (not through kas)."""
        return Kubectl(cluster_assets()["kubectl"], self.state / "cluster" / "admin.kubeconfig")

    def hub(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call to the hub's REST API as the administrator `tether up` bootstrapped."""
        token = (self.state / "secrets" / "admin_token").read_text().strip()
        response = httpx.request(method, f"{HUB}/api/v4{path}", headers={"PRIVATE-TOKEN": token}, timeout=30, **kwargs)
        assert response.status_code < 300, response.text
        return response.json()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, str]]:
    """`tether up` on the default real node, running for the module; stopped (Ctrl-C) at its end."""
    if os.geteuid() != 0:
        pytest.fail("the real node needs root (network namespaces, containerd, kubelet)", pytrace=False)
    directory = tmp_path_factory.mktemp("tether-up")
    # Short: the node's unix sockets live below the state directory (a worker's temporary path is too deep).
    state = Path(tempfile.mkdtemp(prefix="tu-", dir="/tmp"))
    run = Up(state=state, log_path=directory / "up.log")
    try:
        output = run.start()
        yield run, output
    finally:
        run.stop()
        shutil.rmtree(state, ignore_errors=True)


def _shell(command: str, kubeconfig: str, stdin: str = "", timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a printed command line as the user would paste it: kubectl on PATH, KUBECONFIG exported."""
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    env["PATH"] = f"{cluster_assets()['kubectl'].parent}{os.pathsep}{Path(TETHER).parent}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["bash", "-c", command], input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def _workspaces(run: Up, kubeconfig: str) -> list[dict[str, Any]]:
    token = (run.state / "secrets" / "admin_token").read_text().strip()
    listing = _shell(f"TETHER_HUB_URL={HUB} TETHER_PAT={token} tether workspace list --output json", kubeconfig)
    assert listing.returncode == 0, listing.stderr
    return list(json.loads(listing.stdout))


def test_agentk_runs_in_the_cluster_from_its_chart(up: tuple[Up, str]) -> None:
    run, output = up
    admin = run.admin()
    pods = json.loads(
        admin.run(
            "-n", "tether-system", "get", "pods", "-l", "app.kubernetes.io/instance=tether-agent", "-o", "json"
        ).stdout
    )["items"]
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]  # the chart's replicas: 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == "real-node-0"
        assert pod["spec"]["containers"][0]["image"] == "localhost/tether/agentk:0.1.0"
        assert all(s["ready"] for s in pod["status"]["containerStatuses"]), pod["status"]
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "tether-agent"
    # Installed by helm, and one of the two leads (the chart's Lease RBAC in agentk's namespace).
    assert "tether-agent" in admin.run("-n", "tether-system", "get", "secrets", "-l", "owner=helm", "-o", "name").stdout
    leases = admin.run("-n", "tether-system", "get", "leases", "-o", "jsonpath={.items[*].spec.holderIdentity}").stdout
    assert leases.strip() in {p["metadata"]["name"] for p in pods}, leases
    # kas is a host process whose agent listener is on the host's end of the node's veth, where pods reach it.
    kas = run.line(output, "kas")
    address = re.match(r"agent grpc://(\d+\.\d+\.\d+\.\d+):(\d+),", kas)
    assert address is not None and address[1] != "127.0.0.1", kas
    assert int(address[2]) == KAS_PORTS["agent"]


def test_the_printed_command_runs_a_container_and_execs_into_it_through_kas(up: tuple[Up, str]) -> None:
    run, output = up
    kubeconfig = run.line(output, "kubeconfig (through kas)").removeprefix("export KUBECONFIG=")
    server = Path(kubeconfig).read_text()
    assert "/k8s-proxy/" in server and "pat:" in server, "the printed kubeconfig must go through kas"
    command = run.line(output, "run a container")
    assert command.endswith("kubectl exec -it demo -- sh"), command
    try:
        # No terminal here: kubectl says so and passes stdin on, so the shell in the container reads these lines.
        result = _shell(command, kubeconfig, stdin="echo exec-through-kas-$((6 * 7)) on $(hostname)\nexit\n")
        assert result.returncode == 0, result.stderr
        assert "exec-through-kas-42 on demo" in result.stdout, (result.stdout, result.stderr)
        pod = json.loads(run.admin().run("get", "pod", "demo", "-o", "json").stdout)
        assert pod["spec"]["nodeName"] == "real-node-0" and pod["status"]["phase"] == "Running"
    finally:
        run.admin().run("delete", "pod", "demo", "--wait=false", check=False)


def test_printed_workspace_create_runs_then_a_restart_marks_it_lost_and_keeps_the_configuration(
    up: tuple[Up, str],
) -> None:
    run, output = up
    kubeconfig = run.line(output, "kubeconfig (through kas)").removeprefix("export KUBECONFIG=")
    create = run.line(output, "workspace") + " --name ws-up"
    result = _shell(create, kubeconfig, timeout=300)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "ws-up: Running" in result.stdout + result.stderr, (result.stdout, result.stderr)
    namespace = re.search(r"^namespace:\s+(\S+)$", result.stdout, re.MULTILINE)
    assert namespace is not None, result.stdout
    ns = namespace[1]
    admin = run.admin()
    pods = json.loads(admin.run("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running and running[0]["spec"]["nodeName"] == "real-node-0", pods
    # The default devfile, with the image the node has (the hub's default_devfile_image, set by tether up).
    assert running[0]["spec"]["containers"][0]["image"] == WORKSPACE_IMAGE
    admin.run("-n", ns, "exec", running[0]["metadata"]["name"], "--", "sh", "-c", "echo kept > /projects/work.txt")

    # The user edits the agent configuration; the next start must keep it as written.
    project = run.hub("GET", "/projects/root%2Ftether-demo")
    agent = run.hub("GET", f"/projects/{project['id']}/cluster_agents")[0]
    config_path = f"/projects/{project['id']}/cluster_agents/{agent['id']}/configuration"
    current = run.hub("GET", config_path)["content"]
    edited = "# my notes\n" + current.replace("enabled: true", "enabled: true\n  partial_sync_interval: 5s")
    token = (run.state / "secrets" / "admin_token").read_text().strip()
    put = httpx.put(
        f"{HUB}/api/v4{config_path}",
        content=edited,
        headers={"PRIVATE-TOKEN": token, "Content-Type": "application/yaml"},
        timeout=30,
    )
    assert put.status_code == 200, put.text

    run.stop()
    output = run.start()
    assert "workspaces of the previous cluster marked Terminated (lost): ws-up" in output, output
    workspaces = {w["name"]: w for w in _workspaces(run, kubeconfig)}
    lost = workspaces["ws-up"]
    assert (lost["desiredState"], lost["actualState"]) == ("Terminated", "Terminated"), lost
    kept = re.search(r"kept in (\S+)$", lost["actualStateMessage"])
    assert lost["actualStateMessage"].startswith("lost: `tether up` replaced the development cluster"), lost
    assert kept is not None, lost
    assert [p.read_text() for p in Path(kept[1]).glob("*ws-up*/work.txt")] == ["kept\n"]
    assert run.hub("GET", config_path)["content"] == edited
    # A new workspace runs in the new cluster; by then agentk has reconciled, and was not sent the lost one.
    new_kubeconfig = run.line(output, "kubeconfig (through kas)").removeprefix("export KUBECONFIG=")
    again = _shell(run.line(output, "workspace") + " --name ws-again", new_kubeconfig, timeout=300)
    assert again.returncode == 0 and "ws-again: Running" in again.stdout + again.stderr, (again.stdout, again.stderr)
    assert run.admin().run("get", "ns", ns, check=False).returncode != 0, "the lost workspace came back empty"
