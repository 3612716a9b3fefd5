"""Upstream glab 1.72 against the Tether hub and kas (issue 11): agent and token commands, get-token with
``--check-revoked``, update-kubeconfig then kubectl, and ``cluster graph`` showing a live change."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import uuid

import pytest

from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc
from tests.interop.conftest import Factory
from tests.interop.harness import PROJECT, Interop, answers_200
from tests.interop.test_upstream_peers import AGENT_ACCESS
from tests.support.polling import poll_sync
from tether_devenv import upstream
from tether_devenv.process import free_port

pytestmark = [pytest.mark.k8s, pytest.mark.redis, pytest.mark.upstream]


def glab_ok(env: Interop, *args: str, token: str | None = None) -> str:
    result = env.glab(*args, token=token)
    assert result.returncode == 0, (args, result.stderr[-2000:])
    return result.stdout


def pat_token(credential_json: str) -> str:
    token = json.loads(credential_json)["status"]["token"]
    prefix, _agent, pat = token.split(":", 2)
    assert prefix == "pat"
    return str(pat)


def test_glab_prints_its_released_version(upstream_bins: upstream.UpstreamBinaries) -> None:
    """Issue 22 item 6: the built glab is stamped as glab's Makefile stamps a release (not ``glab DEV ()``)."""
    result = subprocess.run(
        [str(upstream_bins.glab), "version"], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "glab 1.72.0 (294f0726)\n"


def test_glab_cluster_commands(interop_env: Factory, kubectl: Kubectl, k8s_namespace: str) -> None:
    env, kas = interop_env("tether")
    assert isinstance(kas, KasProc)
    env.set_configuration(AGENT_ACCESS)
    agentk = env.system.agentk_at(env.agent_token, kas.agent_address, "glab-agentk")
    poll_sync(lambda: answers_200(f"http://127.0.0.1:{agentk.observability_port}/readiness"), "Tether agentk ready", 90)
    agent = str(env.agent_id)
    dev_id = int(env.hub.api(env.user_token).get("/personal_access_tokens/self").json()["user_id"])
    dev = env.hub.token_for(dev_id, ("api", "k8s_proxy"))  # cluster graph sends it to kas as pat:<agent>:<token>

    listed = glab_ok(env, "cluster", "agent", "list", "-R", PROJECT)
    assert "interop" in listed
    # Walks groups, projects and agents and reads each agent's config.yaml (raw repository file).
    usage = env.glab("cluster", "agent", "check_manifest_usage", "--group", "platform", "--recursive")
    assert usage.returncode == 0, usage.stderr[-2000:]
    assert "platform/clusters\tinterop\t0" in usage.stdout + usage.stderr
    assert "does not have manifest projects configured" in usage.stdout + usage.stderr  # it read the file

    tokens = f"/projects/{env.project_id}/cluster_agents/{env.agent_id}/tokens"
    spare = env.hub.api().post(tokens, json={"name": "spare"}).json()
    table = glab_ok(env, "cluster", "agent", "token", "list", agent, "-R", PROJECT)
    assert "agentk" in table and "spare" in table
    glab_ok(env, "cluster", "agent", "token", "revoke", agent, str(spare["id"]), "-R", PROJECT)
    shown = env.hub.api().get(f"{tokens}/{spare['id']}")
    assert shown.status_code == 404 or shown.json()["status"] == "revoked", shown.text

    get_token = ["cluster", "agent", "get-token", "--agent", agent, "-R", PROJECT, "--cache-mode", "force-filesystem"]
    first = pat_token(glab_ok(env, *get_token, token=dev))
    assert pat_token(glab_ok(env, *get_token, "--check-revoked", token=dev)) == first  # cached, still valid
    pat_id = env.hub.api(first).get("/personal_access_tokens/self").json()["id"]
    assert env.hub.api().delete(f"/personal_access_tokens/{pat_id}").status_code == 204
    assert pat_token(glab_ok(env, *get_token, token=dev)) == first  # without the check the cache hands it out
    renewed = pat_token(glab_ok(env, *get_token, "--check-revoked", token=dev))
    assert renewed != first
    assert env.hub.api(renewed).get("/personal_access_tokens/self").json()["revoked"] is False

    kubeconfig = env.directory / "glab.kubeconfig"
    glab_ok(
        env,
        "cluster",
        "agent",
        "update-kubeconfig",
        "--agent",
        agent,
        "-R",
        PROJECT,
        "--kubeconfig",
        str(kubeconfig),
        "--use-context",
        "--cache-mode",
        "force-filesystem",
        "--check-revoked",
        token=dev,
    )
    kc = Kubectl(kubectl.binary, kubeconfig)
    cluster_name = kc.json("config", "view")["clusters"][0]["name"]
    assert kc.json("config", "view")["clusters"][0]["cluster"]["server"] == kas.k8s_proxy_url
    kc.run("config", "set-cluster", cluster_name, f"--certificate-authority={env.tls.ca_cert}")
    kc_env_run = _with_glab_env(env, dev)
    got = kc_env_run(kc, "get", "namespace", k8s_namespace, "-o", "name")
    assert got.returncode == 0 and got.stdout.strip() == f"namespace/{k8s_namespace}", got.stderr[-1500:]

    _graph_shows_live_change(env, dev, kubectl, k8s_namespace)


def _with_glab_env(env: Interop, token: str):  # type: ignore[no-untyped-def]
    """kubectl whose exec credential plugin (glab get-token) finds the hub and the user's token."""

    def run(kc: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
        config_dir = env.directory / "glab-config"
        environ = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(env.directory),
            "GITLAB_TOKEN": token,
            "GLAB_CONFIG_DIR": str(config_dir),
            "GLAB_CHECK_UPDATE": "false",
        }
        return subprocess.run(
            [str(kc.binary), f"--kubeconfig={kc.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=environ,
            check=False,
        )

    return run


def _graph_shows_live_change(env: Interop, token: str, direct: Kubectl, namespace: str) -> None:
    port = free_port()
    graph = subprocess.Popen(
        [
            str(env.bins.glab),
            "cluster",
            "graph",
            "-R",
            PROJECT,
            "-a",
            str(env.agent_id),
            "--listen-addr",
            f"127.0.0.1:{port}",
            "-n",
            namespace,
            "-r",
            "configmaps",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_glab_env(env, token),
    )
    try:
        conn = poll_sync(lambda: _open_stream(port), "glab cluster graph to listen", 30)
        response = conn.getresponse()
        assert response.status == 200, response.read(2000)
        name = f"live-{uuid.uuid4().hex[:6]}"
        seen = b""
        deadline = time.monotonic() + 90
        created = False
        while time.monotonic() < deadline:
            chunk = response.read1(65536)  # type: ignore[attr-defined]
            if not chunk:
                break
            seen += chunk
            if not created and b"</svg>" in seen:  # the first frame is drawn: now change the cluster
                direct.run("-n", namespace, "create", "configmap", name, "--from-literal=k=v")
                created = True
            if created and name.encode() in seen:
                return
        pytest.fail(f"glab cluster graph did not show {name}; stderr: {_stop(graph)[-2000:]}")
    finally:
        _stop(graph)


def _glab_env(env: Interop, token: str) -> dict[str, str]:
    env.glab("version")  # writes the config file
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(env.directory),
        "GITLAB_HOST": env.hub.url,
        "GITLAB_TOKEN": token,
        "GLAB_CONFIG_DIR": str(env.directory / "glab-config"),
        "GLAB_CHECK_UPDATE": "false",
        "GLAB_SEND_TELEMETRY": "false",
        # kas' proxy listener has a test CA: Go reads extra roots from here.
        "SSL_CERT_FILE": str(env.tls.ca_cert),
    }


def _open_stream(port: int) -> http.client.HTTPConnection | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
    try:
        conn.request("GET", "/")
    except OSError:
        conn.close()
        return None
    return conn


def _stop(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.stderr.read() if process.stderr else ""
