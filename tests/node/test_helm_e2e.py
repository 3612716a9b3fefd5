"""Tether installed with its Helm charts on the real node, end to end (issue 22 item 4, docs/deployment.md).

``helm install tether`` (two kas, the hub, bundled Redis) and ``helm install tether-agent`` with a token made
in that hub; two agentk pods Running with exactly one leader; kubectl through kas on real containers; the
graph; a Redis pod and a kas pod deleted under load; the leader deleted and another taking over; ``helm
upgrade`` of both under 20 clients; ``helm uninstall`` leaving only what the chart keeps on purpose. The
figures of ``bench/results/deploy.json`` come from ``bench/deploy.py`` on the same set-up
(``tests/support/helm_deploy.py``); here every bound is a generous deadline, never a timing assertion.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.fixtures.k8s import Kubectl
from tests.graph.harness import GraphModel, include
from tests.node.test_real_node import exercise_verbs, kubectl_run
from tests.support import helm_deploy as hd
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1200)]


@pytest.fixture
def installation(real_node_cluster: ClusterInfo, kubectl: Kubectl, tmp_path: Path) -> Iterator[hd.Installation]:
    """Both releases installed on the real node; whatever the test left is removed afterwards."""
    helm = None
    try:
        inst = hd.install(real_node_cluster, kubectl, tmp_path / "deploy", progress=print)
        helm = inst.helm
        yield inst
    finally:
        hd.remove_everything(kubectl, helm or hd.Helm(kubectl.kubeconfig, tmp_path / "deploy" / "helm"))


def _stopwatch() -> Callable[[str], None]:
    """Prints the seconds each phase took (shown with the output of a failed run, or with ``-s``)."""
    last = [time.monotonic()]

    def lap(phase: str) -> None:
        now = time.monotonic()
        print(f"{phase}: {now - last[0]:.1f}s")
        last[0] = now

    return lap


async def _graph_shows(inst: hd.Installation, pod: str) -> None:
    """The Graph API WebSocket (kas' ``/k8s-proxy/graph``) shows the real pod ``pod`` of the work namespace."""
    request = {"queries": [include("resource == 'pods'")], "namespaces": {"names": [hd.WORK_NS]}}
    headers = {"Authorization": f"Bearer {inst.proxy_token}"}
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            inst.kas_proxy_url + "graph", protocols=["gitlab-agent-graph-api"], headers=headers, ssl=inst.ssl_context()
        )
        await ws.send_str(json.dumps(request))
        model = GraphModel()
        while model.find("pods", pod, hd.WORK_NS) is None:
            message = await ws.receive(timeout=120)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            model.apply(message.data.encode())
        await ws.close()


async def _replace_pod(inst: hd.Installation, namespace: str, component: str, replicas: int) -> None:
    """Delete one pod of ``component`` and wait until ``replicas`` Ready pods (a new one among them) serve."""
    victim = (await asyncio.to_thread(inst.ready_pods, namespace, component))[0]
    await kubectl_run(inst.admin, "delete", "pod", victim, "-n", namespace, "--wait=false")

    def replaced() -> bool:
        ready = inst.ready_pods(namespace, component)
        return len(ready) == replicas and victim not in ready

    await asyncio.to_thread(hd.wait_until, replaced, hd.STEP_S, f"a new Ready {component} pod")


async def test_helm_install_runs_tether_on_real_pods_and_uninstall_leaves_nothing(
    installation: hd.Installation, tmp_path: Path
) -> None:
    inst = installation
    lap = _stopwatch()
    # Two agentk pods Running on the real node, exactly one of them holding the Lease.
    agents = await asyncio.to_thread(inst.pods, hd.AGENT_NS, "agentk")
    assert len(agents) == 2 and all(p["status"]["phase"] == "Running" for p in agents)
    assert {p["spec"]["nodeName"] for p in agents} == {"real-node-0"}
    leader = await asyncio.to_thread(inst.leader)
    assert leader in {p["metadata"]["name"] for p in agents}
    for pod in agents:
        log = await kubectl_run(inst.admin, "logs", "-n", hd.AGENT_NS, pod["metadata"]["name"])
        assert ("leader_elected" in log) == (pod["metadata"]["name"] == leader), pod["metadata"]["name"]
    # The Lease belongs to the agentk Deployment: uninstalling the chart removes it (it is created at run time).
    owners = (await asyncio.to_thread(inst.lease))["metadata"].get("ownerReferences", [])
    assert [(o["kind"], o["name"]) for o in owners] == [("Deployment", hd.AGENT_RELEASE)]

    lap("agentk pods and the Lease")
    # kubectl through kas (NodePort -> kas -> agentk -> API server -> kubelet) on real containers:
    # get, apply, wait, exec, logs, cp, port-forward, attach, as the hub user with their own RBAC.
    kc = inst.proxy_kubectl()
    await exercise_verbs(kc, kc, hd.WORK_NS, "helm", tmp_path)
    listed = (await kubectl_run(kc, "get", "pods", "-n", hd.WORK_NS, "-o", "name")).split()
    assert {"pod/web-helm", "pod/echo-helm"} <= set(listed), listed
    await _graph_shows(inst, "web-helm")

    lap("kubectl through kas, the graph")
    # A Redis pod, then a kas pod deleted and replaced under load: no request fails past its deadline.
    async with hd.Load(inst, clients=5) as load:
        await _replace_pod(inst, hd.SERVER_NS, "redis", 1)
        await _replace_pod(inst, hd.SERVER_NS, "kas", 2)
        await asyncio.to_thread(hd.wait_until, lambda: inst.ready_pods(hd.AGENT_NS, "agentk"), 60, "agentk")
        await asyncio.sleep(2)
    assert load.report.requests > 0 and load.report.failed == 0, load.report

    lap("Redis and kas pods replaced under load")
    # The leader deleted: the other replica takes the Lease; the Deployment brings back two pods.
    old, new, _seconds = await asyncio.to_thread(hd.fail_over, inst)
    assert new != old
    await asyncio.to_thread(
        hd.wait_until, lambda: len(inst.ready_pods(hd.AGENT_NS, "agentk")) == 2, hd.STEP_S, "two agentk again"
    )

    lap("leader failover")
    # helm upgrade of both releases (a rolling update of kas and agentk) under 20 clients.
    rolled = ((hd.SERVER_NS, "kas"), (hd.AGENT_NS, "agentk"))
    before = {c: set(await asyncio.to_thread(inst.ready_pods, ns, c)) for ns, c in rolled}
    async with hd.Load(inst, clients=20) as load:
        await asyncio.to_thread(hd.roll_out, inst, "2")
    assert load.report.requests > 0 and load.report.failed == 0, load.report
    for namespace, component in rolled:
        after = set(await asyncio.to_thread(inst.ready_pods, namespace, component))
        assert len(after) == 2 and not after & before[component], (component, before[component], after)

    lap("helm upgrade under 20 clients")
    # helm uninstall: nothing left but what the chart keeps on purpose (helm.sh/resource-policy: keep).
    await kubectl_run(inst.admin, "delete", "namespace", hd.WORK_NS, "--wait=false")
    await asyncio.to_thread(hd.uninstall, inst)

    # The test's own objects (kas' TLS Secret, the NodePort Service) go too, then the garbage collector's turn:
    # the Lease follows its owner, the agentk Deployment.
    await kubectl_run(inst.admin, "delete", "-n", hd.SERVER_NS, "secret/kas-tls", f"service/{hd.KAS_NODEPORT_SERVICE}")
    # Terminating pods (kas' grace period is 45 s) and the garbage collector take a while: wait for the end state.
    kept = ["PersistentVolumeClaim/tether-hub", "Secret/tether-secrets"]
    for namespace, expected in ((hd.AGENT_NS, []), (hd.SERVER_NS, kept)):
        try:
            await asyncio.to_thread(
                hd.wait_until,
                lambda ns=namespace, want=expected: hd.leftovers(inst, ns) == want,
                180,
                f"{namespace} to settle",
            )
        except AssertionError:
            pytest.fail(f"helm uninstall left in {namespace}: {hd.leftovers(inst, namespace)} (expected {expected})")
    assert await asyncio.to_thread(hd.cluster_leftovers, inst) == []
    lap("helm uninstall")
