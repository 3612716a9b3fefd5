"""Real kubectl -> kas 1's Kubernetes API proxy -> kas 2 -> agentk -> the real cluster (issue 5, kas.md §5).

agentk is connected to kas 2 only and both kas share Redis, so every request is routed across kas
instances through the tunnels. The hub stub answers ``authorize_proxy_user``. kubectl runs in a thread:
the hub stub lives on the test's event loop, which must keep running while kas asks it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.redis]

_ids = itertools.count(7001)


def proxy_kubeconfig(path: Path, kas: KasProc, token: str | None, namespace: str = "default") -> Path:
    """A kubeconfig whose server is kas' ``/k8s-proxy/`` and whose token is ``token`` (e.g. ``pat:7:glpat-x``)."""
    user: dict[str, Any] = {"token": token} if token else {}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "kas",
                        "cluster": {"server": kas.k8s_proxy_url, "certificate-authority": str(kas.k8s_proxy_ca)},
                    }
                ],
                "users": [{"name": "gitlab", "user": user}],
                "contexts": [{"name": "kas", "context": {"cluster": "kas", "user": "gitlab", "namespace": namespace}}],
                "current-context": "kas",
            }
        )
    )
    return path


@dataclass
class Proxied:
    """Two kas, an agent on kas 2 only, and helpers to reach the cluster through kas 1."""

    system: System
    kas1: KasProc
    kas2: KasProc
    agent_id: int
    project_id: int
    binary: Path
    directory: Path

    def kubectl(self, token: str | None, name: str, namespace: str = "default") -> Kubectl:
        return Kubectl(
            self.binary, proxy_kubeconfig(self.directory / f"{name}.kubeconfig", self.kas1, token, namespace)
        )

    def pat(self, secret: str, agent_id: int | None = None) -> str:
        return f"pat:{agent_id or self.agent_id}:{secret}"


def https_client(kas: KasProc) -> aiohttp.ClientSession:
    """An HTTP client trusting the proxy listener's certificate."""
    context = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))


async def run(kubectl: Kubectl, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """kubectl in a thread (the hub stub must keep answering), with a private discovery cache."""
    cache = f"--cache-dir={kubectl.kubeconfig.parent / 'kube-cache'}"
    return await asyncio.to_thread(kubectl.run, cache, *args, check=check)


async def wait_for(check: Any, limit_s: float, what: str) -> Any:
    """Poll ``check`` (sync or async) until truthy; fail after ``limit_s`` seconds (a bound, not a measurement)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit_s}s waiting for {what}")
        await asyncio.sleep(0.1)


async def start_proxied(
    system: System, kas_hub: RealHub, kubectl: Kubectl, tmp_path: Path, **kas1_overrides: Any
) -> Proxied:
    agent_id, project_id = next(_ids), next(_ids)
    token = f"agent-token-{agent_id}-{time.monotonic_ns()}"
    kas_hub.add_agent(token, agent_id, project_id, f"agent-{agent_id}")
    kas1, kas2 = system.kas(**kas1_overrides), system.kas()
    system.agentk(token, kas2, f"proxied-{agent_id}")

    async def connected() -> bool:
        return kas2.private_url in await system.tunnel_urls(agent_id)

    await wait_for(connected, 30, "agentk's tunnels on kas 2")
    assert kas1.private_url not in await system.tunnel_urls(agent_id)
    return Proxied(system, kas1, kas2, agent_id, project_id, kubectl.binary, tmp_path)


@pytest_asyncio.fixture
async def proxied(
    system: System, k8s_cluster: ClusterInfo, kas_hub: RealHub, kubectl: Kubectl, tmp_path: Path
) -> AsyncIterator[Proxied]:
    yield await start_proxied(system, kas_hub, kubectl, tmp_path)


async def test_kubectl_verbs_through_two_kas(
    proxied: Proxied, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str
) -> None:
    pat = f"glpat-{proxied.agent_id}"
    kas_hub.grant_proxy_access(pat, "robot", proxied.agent_id, proxied.project_id)
    kc = proxied.kubectl(proxied.pat(pat), "robot", k8s_namespace)
    await run(kubectl, "run", "proxied-pod", "-n", k8s_namespace, "--image=registry.invalid/x:1", "--restart=Never")

    listing = json.loads((await run(kc, "get", "pods", "-A", "-o", "json")).stdout)
    assert (k8s_namespace, "proxied-pod") in {
        (p["metadata"]["namespace"], p["metadata"]["name"]) for p in listing["items"]
    }
    table = (await run(kc, "get", "pods", "-A")).stdout
    assert "proxied-pod" in table and k8s_namespace in table

    manifest = proxied.directory / "objects.yaml"
    manifest.write_text(
        yaml.safe_dump_all(
            [
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"k": "v1"}},
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": "web"},
                    "spec": {
                        "replicas": 1,
                        "selector": {"matchLabels": {"app": "web"}},
                        "template": {
                            "metadata": {"labels": {"app": "web"}},
                            "spec": {"containers": [{"name": "c", "image": "registry.invalid/web:1"}]},
                        },
                    },
                },
            ]
        )
    )
    applied = await run(kc, "apply", "--server-side", "--field-manager=proxy-test", "-f", str(manifest))
    assert "configmap/applied serverside-applied" in applied.stdout
    assert "deployment.apps/web serverside-applied" in applied.stdout
    # The admin sees what went through the proxy, owned by the field manager given through it.
    admin_view = (
        await run(kubectl, "get", "configmap", "applied", "-n", k8s_namespace, "-o", "json", "--show-managed-fields")
    ).stdout
    assert json.loads(admin_view)["data"] == {"k": "v1"}
    assert any(m["manager"] == "proxy-test" for m in json.loads(admin_view)["metadata"]["managedFields"])
    await run(kubectl, "get", "deployment", "web", "-n", k8s_namespace)

    deleted = await run(kc, "delete", "configmap", "applied", "--wait=false")
    assert 'configmap "applied" deleted' in deleted.stdout
    gone = await run(kubectl, "get", "configmap", "applied", "-n", k8s_namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr

    resources = (await run(kc, "api-resources")).stdout
    for name in ("pods", "configmaps", "deployments", "namespaces", "roles"):
        assert any(line.split()[0] == name for line in resources.splitlines()[1:] if line.strip()), name
    assert "Ready" in (await run(kc, "get", "nodes")).stdout


async def test_watch_delivers_events_live_for_more_than_ten_seconds(
    proxied: Proxied, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str
) -> None:
    pat = f"glpat-watch-{proxied.agent_id}"
    kas_hub.grant_proxy_access(pat, "watcher", proxied.agent_id, proxied.project_id)
    kc = proxied.kubectl(proxied.pat(pat), "watcher", k8s_namespace)
    cache = f"--cache-dir={proxied.directory / 'kube-cache'}"
    watch = await asyncio.create_subprocess_exec(
        str(kc.binary),
        f"--kubeconfig={kc.kubeconfig}",
        cache,
        "get",
        "configmaps",
        "-w",
        "-o",
        "name",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    lines: list[tuple[float, str]] = []

    async def read() -> None:
        assert watch.stdout is not None
        while line := await watch.stdout.readline():
            lines.append((time.monotonic(), line.decode().strip()))

    reader = asyncio.create_task(read())

    def count(name: str) -> int:
        return sum(1 for _, line in lines if line == f"configmap/{name}")

    try:
        # kube-root-ca.crt exists in every namespace: the initial list arrived, the watch is open.
        await wait_for(lambda: count("kube-root-ca.crt"), 30, "the initial list through the proxy")
        started = time.monotonic()
        changes = 0
        # Create, then modify, one object every half second for more than ten seconds. Each event must reach
        # the watching kubectl before the next change is made: the stream is live, not buffered.
        while time.monotonic() - started < 11:
            name = f"w-{changes // 2}"
            before = count(name)
            if changes % 2 == 0:
                await run(kubectl, "create", "configmap", name, "-n", k8s_namespace, "--from-literal=n=0")
            else:
                await run(kubectl, "label", "configmap", name, "-n", k8s_namespace, "seen=yes")
            changes += 1
            await wait_for(lambda name=name, before=before: count(name) > before, 30, f"the watch event for {name}")
            await asyncio.sleep(0.5)
        assert watch.returncode is None and not reader.done(), "the watch ended early"
        events = [t for t, line in lines if line.startswith("configmap/w-")]
        assert len(events) == changes
        assert events[-1] - events[0] >= 10, "events kept arriving through the tunnel for over 10 s"
    finally:
        watch.kill()
        await watch.wait()
        reader.cancel()


async def test_access_as_user_impersonates_and_rbac_decides(
    proxied: Proxied, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str
) -> None:
    pid = proxied.project_id
    reader_pat, writer_pat = f"glpat-alice-{pid}", f"glpat-bob-{pid}"
    kas_hub.grant_proxy_access(reader_pat, "alice", proxied.agent_id, pid, as_user=True)  # Developer
    kas_hub.grant_proxy_access(writer_pat, "bob", proxied.agent_id, pid, as_user=True, role="maintainer")
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "cm-read", "namespace": k8s_namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reporters", "namespace": k8s_namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-read"},
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": f"gitlab:project_role:{pid}:developer",
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "cm-all", "namespace": k8s_namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "bob", "namespace": k8s_namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-all"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gitlab:user:bob"}],
        },
    ]
    await asyncio.to_thread(kubectl.run, "apply", "-f", "-", input_text=yaml.safe_dump_all(rbac))
    await run(kubectl, "create", "configmap", "victim", "-n", k8s_namespace, "--from-literal=a=b")
    alice = proxied.kubectl(proxied.pat(reader_pat), "alice", k8s_namespace)
    bob = proxied.kubectl(proxied.pat(writer_pat), "bob", k8s_namespace)

    who = json.loads((await run(alice, "auth", "whoami", "-o", "json")).stdout)["status"]["userInfo"]
    assert who["username"] == "gitlab:user:alice"
    assert {"gitlab:user", f"gitlab:project_role:{pid}:developer"} <= set(who["groups"])
    assert who["extra"] == {
        "agent.gitlab.com/id": [str(proxied.agent_id)],
        "agent.gitlab.com/username": ["alice"],
        "agent.gitlab.com/access_type": ["personal_access_token"],
        "agent.gitlab.com/config_project_id": [str(pid)],
    }

    assert "victim" in (await run(alice, "get", "configmaps")).stdout
    refused = await run(alice, "delete", "configmap", "victim", check=False)
    assert refused.returncode != 0
    assert 'User "gitlab:user:alice" cannot delete resource "configmaps"' in refused.stderr
    # The API server's own 403 Status comes through unchanged.
    async with https_client(proxied.kas1) as client:
        url = f"{proxied.kas1.k8s_proxy_url}api/v1/namespaces/{k8s_namespace}/configmaps/victim"
        async with client.delete(url, headers={"Authorization": f"Bearer {proxied.pat(reader_pat)}"}) as response:
            status = await response.json()
            assert response.status == 403
            assert (status["kind"], status["reason"], status["code"]) == ("Status", "Forbidden", 403)
            assert "gitlab:user:alice" in status["message"]
            assert "Gitlab-Unauthorized" not in response.headers
    assert "victim" in (await run(kubectl, "get", "configmaps", "-n", k8s_namespace)).stdout

    deleted = await run(bob, "delete", "configmap", "victim", "--wait=false")
    assert 'configmap "victim" deleted' in deleted.stdout
    bob_who = json.loads((await run(bob, "auth", "whoami", "-o", "json")).stdout)["status"]["userInfo"]
    assert bob_who["username"] == "gitlab:user:bob"
    assert f"gitlab:project_role:{pid}:maintainer" in bob_who["groups"]


async def test_refusals_are_status_json_with_clear_messages(
    system: System, k8s_cluster: ClusterInfo, kas_hub: RealHub, kubectl: Kubectl, tmp_path: Path
) -> None:
    proxied = await start_proxied(system, kas_hub, kubectl, tmp_path, routing={"tunnel_find_timeout": "2s"})
    pid, absent = proxied.project_id, next(_ids)
    robot, alice, stranger = (f"glpat-{who}-{proxied.agent_id}" for who in ("robot", "alice", "stranger"))
    kas_hub.grant_proxy_access(robot, "robot", proxied.agent_id, pid)
    kas_hub.grant_proxy_access(robot, "robot", absent, pid)  # allowed, but this agent never connects
    kas_hub.grant_proxy_access(alice, "alice", proxied.agent_id, pid, as_user=True)
    # A Developer of another project, which only agent `absent` lets in: no access to the proxied agent.
    kas_hub.grant_proxy_access(stranger, "stranger", absent, next(_ids))
    base = proxied.kas1.k8s_proxy_url
    cases = [
        ("missing token", base + "api/v1/namespaces", {}, 401, "Unauthorized: no credentials"),
        ("wrong token", base + "api", {"Authorization": f"Bearer {proxied.pat('glpat-wrong')}"}, 401, "not valid"),
        (
            "user without access",
            base + "api",
            {"Authorization": f"Bearer {proxied.pat(stranger)}"},
            401,
            f"do not give access to agent {proxied.agent_id}",
        ),
        (
            "agent not connected",
            base + "api",
            {"Authorization": f"Bearer {proxied.pat(robot, absent)}"},
            504,
            "Agent connection not found. Is agent up to date and connected?",
        ),
        (
            "agent not connected, client timeout",
            base + "api?timeout=3s",
            {"Authorization": f"Bearer {proxied.pat(robot, absent)}"},
            504,
            "Agent connection not found",
        ),
        (
            "nested impersonation",
            base + "api",
            {"Authorization": f"Bearer {proxied.pat(alice)}", "Impersonate-User": "admin"},
            403,
            "nested impersonation is not supported",
        ),
        (
            "outside the prefix",
            base.replace("/k8s-proxy/", "/elsewhere/") + "api",
            {"Authorization": f"Bearer {proxied.pat(robot)}"},
            400,
            "is not under '/k8s-proxy/'",
        ),
    ]
    async with https_client(proxied.kas1) as client:
        async with client.get(base + "api", headers={"Authorization": f"Bearer {proxied.pat(robot)}"}) as response:
            assert response.status == 200 and (await response.json())["kind"] == "APIVersions"
            # A relayed answer is never sniffed or framed either (issue 27 item 8).
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["X-Frame-Options"] == "DENY"
            assert response.headers["Content-Security-Policy"] == "frame-ancestors 'none'"
        for what, url, headers, code, fragment in cases:
            async with client.get(url, headers=headers) as response:
                assert response.status == code, what
                assert response.content_type == "application/json", what
                status = await response.json()
                assert (status["kind"], status["apiVersion"], status["status"], status["code"]) == (
                    "Status",
                    "v1",
                    "Failure",
                    code,
                ), what
                assert status["message"].startswith("GitLab Agent Server: "), what
                assert fragment in status["message"], (what, status["message"])
                assert (response.headers.get("Gitlab-Unauthorized") == "true") == (code == 401), what
                assert response.headers["X-Content-Type-Options"] == "nosniff", what

    # The same refusals as kubectl users see them. (Discovery errors hide the server's message, so these use
    # --raw; without any credentials kubectl would prompt for a password.)
    pods = ("get", "--raw", "/api/v1/namespaces/default/pods")
    wrong = await run(proxied.kubectl(proxied.pat("glpat-wrong"), "wrong"), *pods, check=False)
    assert wrong.returncode != 0 and "GitLab Agent Server: Unauthorized: the credentials are not valid" in wrong.stderr
    absent_kc = proxied.kubectl(proxied.pat(robot, absent), "absent")
    waiting = await run(absent_kc, *pods, "--request-timeout=3s", check=False)
    assert waiting.returncode != 0 and "GitLab Agent Server: Agent connection not found" in waiting.stderr
    nested = await run(proxied.kubectl(proxied.pat(alice), "alice"), *pods, "--as=admin", check=False)
    assert nested.returncode != 0 and "nested impersonation is not supported" in nested.stderr


async def test_client_that_gives_up_cancels_the_routed_call(system: System, kas_hub: RealHub) -> None:
    kas = system.kas()  # tunnel_find_timeout 20 s: the request would wait that long for the agent
    absent = next(_ids)
    pat = f"glpat-impatient-{absent}"
    kas_hub.grant_proxy_access(pat, "impatient", absent, 1)
    async with https_client(kas) as client:
        request = asyncio.ensure_future(
            client.get(kas.k8s_proxy_url + "api", headers={"Authorization": f"Bearer pat:{absent}:{pat}"})
        )
        await wait_for(lambda: kas.gauge("tunnel_find_requests_waiting") >= 1, 10, "the request to wait for a tunnel")
        request.cancel()  # the client gives up and closes its connection
        await wait_for(lambda: kas.gauge("tunnel_find_requests_waiting") == 0, 10, "the routed call to be cancelled")
