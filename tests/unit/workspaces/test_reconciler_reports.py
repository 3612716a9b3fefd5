"""agentk's reconcile request: a pod problem that becomes lasting is reported again (issue 23 item 4).

Pure logic: the reconciler reads only the informer's cache to build a request; a stand-in cache is enough.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import msgspec

from tether.kube.client import KubeClient
from tether.modules.remote_development.agent.informer import PodProblem, WorkspaceInformer
from tether.modules.remote_development.agent.reconciler import Reconciler

ANNOTATIONS = {"workspaces.gitlab.com/id": "1"}
DEPLOYMENT = {
    "metadata": {
        "name": "ws",
        "namespace": "ns",
        "resourceVersion": "7",
        "annotations": ANNOTATIONS,
    },
    "spec": {"replicas": 1},
    "status": {},
}


class Cache:
    def __init__(self, problem: PodProblem) -> None:
        self.found = problem

    def deployments(self) -> list[dict[str, Any]]:
        return [DEPLOYMENT]

    def problem(self, namespace: str, workspace_id: str) -> PodProblem | None:
        return self.found if (namespace, workspace_id) == ("ns", "1") else None


async def _infos(reconciler: Reconciler) -> list[dict[str, Any]]:
    """The ``workspace_agent_infos`` of the next request, as they go on the wire."""
    request = msgspec.to_builtins(await reconciler.build_request())
    return cast(list[dict[str, Any]], request["workspace_agent_infos"])


async def test_an_unschedulable_pod_is_reported_again_once_it_lasted() -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    cache = Cache(PodProblem("Unschedulable", "unbound claims", since))
    reconciler = Reconciler(cast(KubeClient, None), cast(WorkspaceInformer, cache), 1, unschedulable_grace_s=3600)
    [first] = await _infos(reconciler)
    assert first["pod_failure"] == {"reason": "Unschedulable", "message": "unbound claims", "lasting": False}
    reconciler.full_done = True
    reconciler._acknowledged["ws"] = "7"  # the hub echoed the Deployment's version
    assert (await _infos(reconciler)) == []  # nothing new
    reconciler._unschedulable_grace_s = 1  # the same cause, now older than the grace
    [again] = await _infos(reconciler)
    assert again["pod_failure"]["lasting"] is True and again["latest_k8s_deployment_info"] == DEPLOYMENT
