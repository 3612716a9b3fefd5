"""The README's main job: `tether up`, then kubectl through kas with the printed kubeconfig, then Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import grpc
import httpx
import pytest

from tests.fixtures.k8s import cluster_assets
from tests.fixtures.system import TETHER
from tether_devenv.process import pid_alive
from tether_devenv.up import FRONT_PROXY_PORT, GITALY_PORT, HUB_PORT

pytestmark = pytest.mark.k8s


@pytest.mark.parametrize(
    ("replicas", "front_proxy"),
    [(1, False), (2, True)],
    ids=["one-kas-in-memory", "two-kas-with-redis-behind-the-front-proxy"],
)
def test_tether_up_then_kubectl_through_kas_then_ctrl_c(
    tmp_path: Path, replicas: int, front_proxy: bool, request: pytest.FixtureRequest
) -> None:
    kubectl = cluster_assets()["kubectl"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    log = (tmp_path / "up.log").open("w+")
    # kwok nodes and agentk on the host: the real node's default is tests/node/test_tether_up.py's (one run).
    args = [TETHER, "up", "--kwok-only", "--state-dir", str(tmp_path / "state")]
    if replicas > 1:
        # agentk then connects to the last replica and kubectl to the first: every request crosses kas -> kas.
        args += ["--replicas", str(replicas), "--redis", request.getfixturevalue("redis_server").url]
    if front_proxy:
        # agentk's tunnels then pass HAProxy (issue 27): kubectl below works only if they do.
        args += ["--front-proxy"]
    up = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # Generous: a fresh hub alone took 44 s to answer (migrations) with the machine at load 23.
        deadline = time.monotonic() + 300
        while "Press Ctrl-C to stop." not in (tmp_path / "up.log").read_text():
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.5)
        output = (tmp_path / "up.log").read_text()
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", output)
        assert kubeconfig is not None, output
        nodes = subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig[1]}", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert nodes.returncode == 0, nodes.stderr
        assert "node/kwok-node-0" in nodes.stdout
        server = Path(kubeconfig[1]).read_text()
        assert "/k8s-proxy/" in server and "pat:" in server, "kubectl must go through kas, not to the API server"
        # The hub publishes the kas addresses where glab looks for them (issue 11).
        admin = (tmp_path / "state" / "secrets" / "admin_token").read_text().strip()
        metadata = httpx.get(f"http://127.0.0.1:{HUB_PORT}/api/v4/metadata", headers={"PRIVATE-TOKEN": admin}).json()
        assert metadata["kas"]["enabled"] is True
        assert metadata["kas"]["externalK8sProxyUrl"] in server
        assert metadata["kas"]["externalUrl"].startswith("grpc://127.0.0.1:")
        # The Gitaly-compatible service upstream kas reads agent configuration from is on (issue 22 item 6).
        with grpc.insecure_channel(f"127.0.0.1:{GITALY_PORT}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        if front_proxy:
            assert metadata["kas"]["externalUrl"] == f"grpc://127.0.0.1:{FRONT_PROXY_PORT}"
            # agentk was given the proxy's address: the kubectl call above crossed it.
            assert f"agent grpc://127.0.0.1:{FRONT_PROXY_PORT}, " in output, output
            assert (tmp_path / "state" / "logs" / "front-proxy.cfg").exists()
        children = [int(p) for p in re.findall(r"pid (\d+)", output)]
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert up.returncode in (0, -signal.SIGINT)
    assert "stopping" in (tmp_path / "up.log").read_text()
    deadline = time.monotonic() + 20
    while any(pid_alive(p) for p in children):
        assert time.monotonic() < deadline, "cluster processes left running"
        time.sleep(0.2)
