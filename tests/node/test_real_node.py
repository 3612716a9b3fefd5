"""Real containers on the development cluster's real node (issue 22, item 1).

A pod reaches Running on containerd; ``kubectl exec``, ``logs``, ``port-forward``, ``attach`` and ``cp`` work
against it directly and through kas (kas 1 -> kas 2 -> agentk -> the API server -> the kubelet); the host
reaches the pod's IP; a ClusterIP Service answers by its DNS name from another pod (CoreDNS, kube-proxy);
a PersistentVolumeClaim with the default StorageClass binds and a pod writes to it (local-path-provisioner).
Every wait is on a condition with a generous bound: the machine has two loaded cores.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_k8s_proxy import start_proxied
from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tether_devenv.cluster import ClusterInfo
from tether_devenv.node import STORAGE_CLASS
from tether_devenv.oci import BUSYBOX_IMAGE

# Generous: the first test also starts the real-node cluster and the last one removes it (two loaded cores).
pytestmark = [pytest.mark.k8s, pytest.mark.redis, pytest.mark.timeout(900)]

READY_S = 240
PAGE = "hello-from-real-pod"


def _pod(name: str, command: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", command],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container], **spec},
    }


def _web_pod(name: str) -> dict[str, Any]:
    serve = f"mkdir -p /www && echo {PAGE} > /www/index.html && echo started-{name} && exec httpd -f -p 8080 -h /www"
    return _pod(
        name,
        serve,
        {"app": name},
        container={"readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}},
    )


async def kubectl_run(kubectl: Kubectl, *args: str, input_text: str | None = None, check: bool = True) -> str:
    """kubectl in a thread (the hub stub answers kas on this event loop); returns standard output."""
    cache = f"--cache-dir={kubectl.kubeconfig.parent / 'kube-cache'}"
    result = await asyncio.to_thread(kubectl.run, cache, *args, input_text=input_text, check=check)
    return result.stdout


async def apply(kubectl: Kubectl, namespace: str, *objects: dict[str, Any]) -> None:
    await kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(objects))


async def eventually(check: Callable[[], Any], limit_s: float, what: str) -> Any:
    """Await ``check()`` (a coroutine function) until it returns something truthy; fail after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await check()
            if last:
                return last
        except (AssertionError, OSError) as exc:
            last = exc
        await asyncio.sleep(1.0)
    pytest.fail(f"timed out after {limit_s}s waiting for {what} (last: {last!r})")


async def wait_ready(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, Any]:
    await kubectl_run(kubectl, "wait", "-n", namespace, "--for=condition=Ready", f"pod/{pod}", f"--timeout={READY_S}s")
    return json.loads(await kubectl_run(kubectl, "get", "pod", pod, "-n", namespace, "-o", "json"))


async def port_forward_get(kubectl: Kubectl, namespace: str, pod: str) -> str:
    """``kubectl port-forward`` to the pod's 8080 on a free local port; return the page fetched through it."""
    process = await asyncio.create_subprocess_exec(
        str(kubectl.binary),
        f"--kubeconfig={kubectl.kubeconfig}",
        f"--cache-dir={kubectl.kubeconfig.parent / 'kube-cache'}",
        "port-forward",
        "-n",
        namespace,
        f"pod/{pod}",
        ":8080",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 120)).decode()
        found = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert found, f"unexpected port-forward output {line!r}"
        url = f"http://127.0.0.1:{found.group(1)}/"
        return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=60).read().decode())
    finally:
        process.terminate()
        await process.wait()


async def exercise_verbs(kc: Kubectl, admin: Kubectl, namespace: str, tag: str, tmp_path: Path) -> None:
    """exec, logs, cp (both ways), port-forward and attach through ``kc`` against real containers."""
    web = f"web-{tag}"
    await apply(admin, namespace, _web_pod(web))
    await wait_ready(admin, namespace, web)

    assert (await kubectl_run(kc, "exec", "-n", namespace, web, "--", "cat", "/etc/hostname")).strip() == web
    assert f"started-{web}" in await kubectl_run(kc, "logs", "-n", namespace, web)

    upload = tmp_path / f"upload-{tag}.txt"
    upload.write_text(f"copied-{tag}\n")
    await kubectl_run(kc, "cp", str(upload), f"{namespace}/{web}:/tmp/upload.txt")
    assert (await kubectl_run(kc, "exec", "-n", namespace, web, "--", "cat", "/tmp/upload.txt")) == f"copied-{tag}\n"
    download = tmp_path / f"download-{tag}.html"
    await kubectl_run(kc, "cp", f"{namespace}/{web}:/www/index.html", str(download))
    assert download.read_text() == f"{PAGE}\n"

    assert (await port_forward_get(kc, namespace, web)) == f"{PAGE}\n"

    # attach: the container reads its stdin (once) and echoes each line; it exits when the stdin closes.
    echo = f"echo-{tag}"
    await apply(
        admin,
        namespace,
        _pod(
            echo,
            'while read line; do echo "got:$line"; done',
            restartPolicy="Never",
            container={"stdin": True, "stdinOnce": True},
        ),
    )
    await kubectl_run(admin, "wait", "-n", namespace, "--for=jsonpath={.status.phase}=Running", f"pod/{echo}",
                      f"--timeout={READY_S}s")  # fmt: skip
    attached = await kubectl_run(kc, "attach", "-i", "-n", namespace, echo, "-c", "main", input_text="ping\npong\n")
    assert "got:ping" in attached and "got:pong" in attached, attached


async def test_real_pod_runs_and_kubectl_verbs_work_directly(
    real_node_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    node = real_node_cluster.real_nodes["nodes"][0]["net"]
    await exercise_verbs(kubectl, kubectl, k8s_namespace, "direct", tmp_path)
    pod = json.loads(await kubectl_run(kubectl, "get", "pod", "web-direct", "-n", k8s_namespace, "-o", "json"))
    assert pod["spec"]["nodeName"] == node["name"]
    assert pod["status"]["phase"] == "Running"
    # The host reaches the pod's own IP on the node's bridge (route via the node's veth).
    page = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/", timeout=30).read().decode()
    )
    assert page == f"{PAGE}\n"


async def test_kubectl_verbs_work_through_kas(
    k8s_cluster: ClusterInfo, system: System, kas_hub: RealHub, kubectl: Kubectl, k8s_namespace: str, tmp_path: Path
) -> None:
    # `system` gives agentk the kubeconfig of `k8s_cluster`, here the real-node cluster (tests/node/conftest.py).
    proxied = await start_proxied(system, kas_hub, kubectl, tmp_path)
    pat = f"glpat-node-{proxied.agent_id}"
    kas_hub.grant_proxy_access(pat, "node-user", proxied.agent_id, proxied.project_id)
    kc = proxied.kubectl(proxied.pat(pat), "node-user", k8s_namespace)
    await exercise_verbs(kc, kubectl, k8s_namespace, "kas", tmp_path)


async def test_cluster_ip_service_answers_by_dns_name(kubectl: Kubectl, k8s_namespace: str) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "site"},
        "spec": {"selector": {"app": "site"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    await apply(kubectl, k8s_namespace, _web_pod("site"), service, _pod("client", "exec sleep 3600"))
    await wait_ready(kubectl, k8s_namespace, "site")
    await wait_ready(kubectl, k8s_namespace, "client")
    cluster_ip = json.loads(await kubectl_run(kubectl, "get", "service", "site", "-n", k8s_namespace, "-o", "json"))[
        "spec"
    ]["clusterIP"]
    name = f"site.{k8s_namespace}.svc.cluster.local"

    async def resolved() -> bool:
        out = await kubectl_run(kubectl, "exec", "-n", k8s_namespace, "client", "--", "nslookup", name, check=False)
        return cluster_ip in out

    await eventually(resolved, 120, f"{name} to resolve to {cluster_ip}")

    async def answered() -> str:
        return await kubectl_run(
            kubectl, "exec", "-n", k8s_namespace, "client", "--", "wget", "-q", "-O", "-", f"http://{name}/",
            check=False,
        )  # fmt: skip

    assert (await eventually(answered, 120, f"http://{name}/ to answer")) == f"{PAGE}\n"
    # (busybox 1.35's static wget crashes with -T: kubectl's own timeout bounds these calls.)
    # The short name through the pod's search path, as applications use it.
    short = await kubectl_run(
        kubectl, "exec", "-n", k8s_namespace, "client", "--", "wget", "-q", "-O", "-", "http://site/"
    )
    assert short == f"{PAGE}\n"


async def test_claim_with_default_storage_class_binds_and_is_written(
    real_node_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str
) -> None:
    classes = json.loads(await kubectl_run(kubectl, "get", "storageclass", "-o", "json"))["items"]
    defaults = [
        c["metadata"]["name"]
        for c in classes
        if c["metadata"].get("annotations", {}).get("storageclass.kubernetes.io/is-default-class") == "true"
    ]
    assert defaults == [STORAGE_CLASS]
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }
    writer = _pod(
        "writer",
        "echo persisted-by-pod > /data/file.txt && exec sleep 3600",
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
    )
    await apply(kubectl, k8s_namespace, claim, writer)
    await wait_ready(kubectl, k8s_namespace, "writer")
    pvc = json.loads(await kubectl_run(kubectl, "get", "pvc", "data", "-n", k8s_namespace, "-o", "json"))
    assert pvc["status"]["phase"] == "Bound"
    assert pvc["spec"]["storageClassName"] == STORAGE_CLASS
    assert (await kubectl_run(kubectl, "exec", "-n", k8s_namespace, "writer", "--", "cat", "/data/file.txt")) == (
        "persisted-by-pod\n"
    )
    # The volume is a directory on the node's disk, under the cluster's directory.
    written = list((real_node_cluster.directory / "local-path").glob("*/file.txt"))
    assert [p.read_text() for p in written] == ["persisted-by-pod\n"]


async def test_kwok_leaves_the_real_node_alone_and_keeps_its_own(
    real_node_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str
) -> None:
    nodes = {
        n["metadata"]["name"]: n for n in json.loads(await kubectl_run(kubectl, "get", "nodes", "-o", "json"))["items"]
    }
    real, fake = nodes["real-node-0"], nodes["kwok-node-0"]
    # The kubelet, not kwok, reports the real node (kwok's stages would stamp their own versions and IP).
    assert real["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    assert real["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in real["metadata"].get("annotations", {})
    assert {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"} in fake["spec"]["taints"]
    # A pod meant for kwok tolerates the taint and is "run" by kwok, without a container.
    kwok_pod = _pod(
        "on-kwok",
        "exec sleep 3600",
        nodeSelector={"type": "kwok"},
        tolerations=[{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    )
    await apply(kubectl, k8s_namespace, kwok_pod, _pod("on-real", "exec sleep 3600"))
    on_kwok = await wait_ready(kubectl, k8s_namespace, "on-kwok")
    on_real = await wait_ready(kubectl, k8s_namespace, "on-real")
    assert on_kwok["spec"]["nodeName"] == "kwok-node-0" and on_real["spec"]["nodeName"] == "real-node-0"
    assert on_real["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    # kwok never acted on the real node or its pods: a kwok managing every node creates the real node's Lease
    # and patches its status and its pods' status (racing the kubelet, which wins, so only kwok's log shows it).
    kwok_log = (real_node_cluster.directory / "logs" / "kwok.log").read_text()
    assert '"node":"real-node-0"' not in kwok_log.replace(" ", "")
    assert '"node":"kwok-node-0"' in kwok_log.replace(" ", "")
