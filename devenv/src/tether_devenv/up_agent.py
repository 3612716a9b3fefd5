"""``tether up`` on a real node: agentk runs in the cluster from its chart, as in a user's cluster (issue 22 item 5).

Steps, each with progress lines: the agentk image (``make images``' build, reused while its inputs are
unchanged) loaded into the node's containerd (no registry is reachable here, deployment.md §1); helm (built
from its Go module once per machine, cached); ``helm upgrade --install`` of ``deploy/helm/tether-agent`` with
the hub's agent token and kas' agent address on the host's end of the node's veth (kas stays a host process);
then a wait until the Deployment's pods are ready, which for agentk means it received its configuration and
holds a tunnel to kas (``docs/deployment.md``).

Values that differ from the chart's defaults, and why:

- ``rbac.preset: clusterAdmin``: the demo agent's ``user_access`` is ``access_as: agent``, so kubectl through
  kas acts as agentk's ServiceAccount; running a container and ``kubectl exec`` into it needs more than the
  least-privilege preset allows (upstream's chart binds cluster-admin the same way).
- ``networkPolicy``: kas and the API server at their real addresses, and pod egress for workspace access.
- ``image.pullPolicy: Never``: the image was just loaded; a failed load shows as ``ErrImageNeverPull``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tether_devenv.cluster import LocalCluster
from tether_devenv.helm import build_helm
from tether_devenv.images import build_images
from tether_devenv.kubeapi import ApiError, KubeApi
from tether_devenv.process import EnvironmentProblem
from tether_devenv.tools_image import build_tools_image

Progress = Callable[[str], None]
RELEASE = "tether-agent"
#: agentk's namespace: its Lease (leader election) lives here too (the chart's Lease Role).
NAMESPACE = "tether-system"
CHART = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "tether-agent"
#: A cold node start of two agentk pods takes ~20 s here; generous for a loaded machine.
READY_TIMEOUT_S = 300.0
_STATUS_EVERY_S = 15.0


def chart_values(kas_address: str, token: str, image: str, node_host: str, api_port: int) -> dict[str, Any]:
    """The chart values ``tether up`` installs agentk with (module docstring says why each differs).

    Args:
        kas_address: ``grpc://<node_host>:<port>``, kas' agent listener as the node reaches it.
        token: the agent token from the hub.
        image: the loaded image reference, ``repository:tag``.
        node_host: the host's address on the node's veth, where kas and the API server answer.
        api_port: the API server's port there.
    """
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "config": {"kasAddress": kas_address, "token": token},
        "rbac": {"preset": "clusterAdmin"},
        "networkPolicy": {
            "kasCidrs": [f"{node_host}/32"],
            "apiServerCidrs": [f"{node_host}/32"],
            "apiServerPorts": [api_port],
            "allowPodEgress": True,
        },
    }


async def _run(args: list[str], what: str, env: dict[str, str] | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise EnvironmentProblem(f"{what} failed: {(err or out).decode(errors='replace').strip()[-800:]}")
    return out.decode(errors="replace")


async def install_agentk(
    cluster: LocalCluster, kas_address: str, token: str, state_dir: Path, progress: Progress
) -> list[str]:
    """Load the agentk image, install the chart and wait for its pods; return the ready pods' names.

    Raises:
        tether_devenv.images.ImageBuildError: the image cannot be built.
        tether_devenv.build.BuildError: helm cannot be built.
        EnvironmentProblem: loading the image or ``helm`` failed, or the pods were not ready within
            :data:`READY_TIMEOUT_S` (with each pod's state and where to find agentk's log).
    """
    if cluster.real is None or cluster.info is None:
        raise EnvironmentProblem("agentk from its chart needs the real node (tether up without --kwok-only)")
    progress("images: the agentk image (`make images`; reused when its inputs are unchanged)")
    image = (await asyncio.to_thread(build_images, ["agentk"], progress=progress))[0]
    progress(f"loading {image.reference} into the real node's containerd")
    await asyncio.to_thread(cluster.real.import_image, image.archive)
    # The default devfile gets the editor: its tools-injector image must be on the node too (no registry).
    progress("images: the workspace tools injector (the editor copied into each workspace)")
    tools = await asyncio.to_thread(build_tools_image, progress=progress)
    await asyncio.to_thread(cluster.real.import_image, tools.archive)
    helm = await asyncio.to_thread(build_helm, progress=progress)

    values_file = state_dir / "agentk-values.yaml"
    values = chart_values(kas_address, token, image.reference, cluster.real.api_address, cluster.real.api_port)
    values_file.write_text(yaml.safe_dump(values, sort_keys=False))
    values_file.chmod(0o600)  # it holds the agent token
    helm_home = state_dir / "helm"
    env = dict(
        os.environ,
        HELM_CACHE_HOME=str(helm_home / "cache"),
        HELM_CONFIG_HOME=str(helm_home / "config"),
        HELM_DATA_HOME=str(helm_home / "data"),
    )
    progress(f"helm install {RELEASE} ({CHART.relative_to(CHART.parents[2])}) into namespace {NAMESPACE}")
    await _run(
        [
            str(helm),
            "upgrade",
            "--install",
            RELEASE,
            str(CHART),
            f"--namespace={NAMESPACE}",
            "--create-namespace",
            f"--kubeconfig={cluster.info.kubeconfig}",
            f"--values={values_file}",
        ],
        "helm install of the tether-agent chart",
        env,
    )
    return await wait_ready(cluster.info.api, progress)


def _pod_lines(api: KubeApi) -> list[str]:
    pods = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", timeout=5.0)["items"]
    lines = []
    for pod in pods:
        statuses = pod.get("status", {}).get("containerStatuses") or []
        waiting = [s["state"]["waiting"].get("reason", "") for s in statuses if "waiting" in s.get("state", {})]
        ready = all(s.get("ready") for s in statuses) and bool(statuses)
        phase = "ready" if ready else (waiting[0] if waiting and waiting[0] else pod["status"].get("phase", "?"))
        lines.append(f"{pod['metadata']['name']} {phase}")
    return lines


async def wait_ready(api: KubeApi, progress: Progress, limit_s: float = READY_TIMEOUT_S) -> list[str]:
    """Wait until agentk's Deployment has all its replicas ready; print pod states every 15 s.

    Raises:
        EnvironmentProblem: not ready within ``limit_s`` seconds (with each pod's state).
    """
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{RELEASE}"
    began = time.monotonic()
    next_status = began + _STATUS_EVERY_S
    while True:
        try:
            deployment = await asyncio.to_thread(api.request, "GET", path, None, 5.0)
        except ApiError as exc:
            if exc.status != 404:
                raise
            deployment = {}
        wanted = int(deployment.get("spec", {}).get("replicas", 1))
        ready = int(deployment.get("status", {}).get("readyReplicas", 0) or 0)
        if deployment and ready >= wanted:
            pods = await asyncio.to_thread(_pod_lines, api)
            progress(f"agentk ready: {ready}/{wanted} pods ({time.monotonic() - began:.0f}s)")
            return [line.split()[0] for line in pods if line.endswith(" ready")]
        now = time.monotonic()
        if now > began + limit_s:
            pods = await asyncio.to_thread(_pod_lines, api)
            raise EnvironmentProblem(
                f"agentk's pods were not ready within {limit_s:.0f}s: {', '.join(pods) or 'no pods'}; "
                f"see `kubectl -n {NAMESPACE} describe pods` and `kubectl -n {NAMESPACE} logs deploy/{RELEASE}`"
            )
        if now >= next_status:
            pods = await asyncio.to_thread(_pod_lines, api)
            progress(f"  waiting for agentk: {ready}/{wanted} ready ({', '.join(pods) or 'no pods yet'})")
            next_status = now + _STATUS_EVERY_S
        await asyncio.sleep(1.0)
