"""Upstream GitLab agentk 16.5 against Tether kas, and Tether agentk against upstream kas 16.5 (issue 11).

Each direction: the agent gets its configuration, registers (the hub lists the connection), and kubectl
get/apply/watch/logs/exec and impersonation work through the kas Kubernetes API proxy, with no error line in
the logs of the programs involved.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any

import pytest

from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, http_get
from tests.interop.conftest import Factory
from tests.interop.harness import PROJECT, Interop, UpstreamKas, answers_200, error_lines
from tests.support.polling import poll_sync

pytestmark = [pytest.mark.k8s, pytest.mark.redis, pytest.mark.upstream]

AGENT_ACCESS = f"user_access:\n  access_as:\n    agent: {{}}\n  projects:\n    - id: {PROJECT}\n"
USER_ACCESS = f"user_access:\n  access_as:\n    user: {{}}\n  projects:\n    - id: {PROJECT}\n"


def connections(env: Interop) -> list[dict[str, Any]]:
    body = env.hub.api().get(f"/projects/{env.project_id}/cluster_agents/{env.agent_id}").json()
    return list(body["connections"])


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def watch_sees(kc: Kubectl, direct: Kubectl, namespace: str) -> None:
    """A watch through the proxy delivers an object created directly, while it is open."""
    name = f"watched-{uuid.uuid4().hex[:6]}"
    cache = f"--cache-dir={kc.kubeconfig.parent / 'kube-cache-watch'}"
    watch = subprocess.Popen(
        [
            str(kc.binary),
            f"--kubeconfig={kc.kubeconfig}",
            cache,
            "-n",
            namespace,
            "get",
            "configmaps",
            "--watch",
            "-o",
            "name",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2)  # let the watch start before the change
        direct.run("-n", namespace, "create", "configmap", name, "--from-literal=k=v")
        deadline = time.monotonic() + 60
        assert watch.stdout is not None
        while time.monotonic() < deadline:
            line = watch.stdout.readline()
            if f"configmap/{name}" in line:
                return
            if not line and watch.poll() is not None:
                break
        pytest.fail(f"the watch through kas did not deliver {name}: {watch.stderr.read() if watch.stderr else ''}")
    finally:
        watch.kill()
        watch.wait()


def kubectl_paths(env: Interop, server: str, direct: Kubectl, namespace: str) -> None:
    """get, apply, watch, logs, exec and impersonation through the proxy at ``server``."""
    env.set_configuration(AGENT_ACCESS)
    kc = env.proxy_kubectl(server, f"kc-{uuid.uuid4().hex[:6]}", namespace)
    cache = f"--cache-dir={kc.kubeconfig.parent / 'kube-cache'}"
    # The proxy answers once the agent's tunnels are up; allow for the first configuration to arrive.
    poll_sync(
        lambda: kc.run(cache, "get", "namespace", namespace, check=False).returncode == 0, "kubectl get via kas", 90
    )
    assert kc.run(cache, "get", "namespace", namespace, "-o", "name").stdout.strip() == f"namespace/{namespace}"

    manifest = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: {namespace}\ndata:\n  a: b\n"
    applied = kc.run(cache, "apply", "-f", "-", input_text=manifest)
    assert "configmap/applied" in applied.stdout
    assert direct.json("-n", namespace, "get", "configmap", "applied")["data"] == {"a": "b"}

    watch_sees(kc, direct, namespace)

    direct.run("-n", namespace, "run", "pod-1", "--image=registry.invalid/x:1", "--restart=Never")
    for args in (["logs", "pod-1"], ["exec", "pod-1", "--", "true"]):
        through = kc.run(cache, "-n", namespace, *args, check=False)
        straight = direct.run("-n", namespace, *args, check=False)
        # kwok runs no kubelet: both end the same way, which shows the request reached the API server.
        assert (through.returncode, last_line(through.stderr)) == (straight.returncode, last_line(straight.stderr)), (
            args,
            through.stderr[-1000:],
        )

    env.set_configuration(USER_ACCESS)
    whoami = poll_sync(
        lambda: _whoami(kc, cache).startswith("gitlab:user:"), "impersonation of the proxy user", 60, interval=1.0
    )
    assert whoami
    assert _whoami(kc, cache) == "gitlab:user:dev"


def _whoami(kc: Kubectl, cache: str) -> str:
    result = kc.run(cache, "auth", "whoami", "-o", "json", check=False)
    if result.returncode != 0:
        return ""
    return str(json.loads(result.stdout)["status"]["userInfo"]["username"])


def test_upstream_agentk_through_tether_kas(interop_env: Factory, kubectl: Kubectl, k8s_namespace: str) -> None:
    env, kas = interop_env("tether")
    assert isinstance(kas, KasProc)
    agentk = env.upstream_agentk(kas.agent_address)
    listed = poll_sync(lambda: connections(env), "the hub to list upstream agentk's pod (AgentRegistrar.Register)", 90)
    assert [(c["pod_name"], c["pod_namespace"]) for c in listed] == [("upstream-agentk", "gitlab-agent")]
    assert listed[0]["agent_version"].startswith("v16.5.0")
    poll_sync(agentk.ready, "upstream agentk readiness", 60)

    kubectl_paths(env, kas.k8s_proxy_url, kubectl, k8s_namespace)
    assert error_lines(agentk.process.log_path) == []


def test_tether_agentk_through_upstream_kas(interop_env: Factory, kubectl: Kubectl, k8s_namespace: str) -> None:
    env, kas = interop_env("upstream")
    assert isinstance(kas, UpstreamKas)
    env.set_configuration("observability:\n  logging:\n    level: debug\n")
    agentk = env.system.agentk_at(env.agent_token, kas.agent_address, "tether-agentk")
    # Ready = a configuration came from upstream kas (read from the hub's Gitaly-compatible service) and a
    # tunnel is connected.
    poll_sync(
        lambda: answers_200(f"http://127.0.0.1:{agentk.observability_port}/readiness"),
        "Tether agentk to become ready behind upstream kas",
        90,
    )
    listed = poll_sync(lambda: connections(env), "upstream kas to list Tether agentk (Register)", 60)
    assert [(c["pod_name"], c["pod_namespace"]) for c in listed] == [("tether-agentk", "tether-system")]

    kubectl_paths(env, kas.k8s_proxy_url, kubectl, k8s_namespace)
    assert error_lines(agentk.process.log_path) == []
    assert error_lines(kas.process.log_path) == []
    assert http_get(f"http://127.0.0.1:{kas.ports['observability']}/readiness")[0] == 200
