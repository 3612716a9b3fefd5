"""What agentk sees of its workspaces: Deployments and their pods' problems (reference §5.3).

Two reflectors, both selected by ``agent.gitlab.com/id=<agent id>`` in all namespaces: Deployments (kept
whole, less ``managedFields``, as upstream's informer cache) and Pods (only a one-line problem per workspace
is kept: Tether's fast failure reasons).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.kube.client import KubeClient, KubeError
from tether.kube.reflector import Reflector
from tether.modules.remote_development import AGENT_ID_LABEL
from tether.modules.remote_development.protocol import FAILING_POD_REASONS

WORKSPACE_ID_ANNOTATION = "workspaces.gitlab.com/id"
_MAX_MESSAGE = 512
#: How long a pod may stay unschedulable before that is a failure. The scheduler also says Unschedulable while
#: things that resolve on their own are under way: a claim being bound or provisioned (Immediate binding, or
#: a WaitForFirstConsumer provisioner still working), a volume or node being added. Kubernetes' own verdict
#: comes only at the Deployment's progress deadline (600 s by default); a minute keeps Failed fast.
UNSCHEDULABLE_GRACE_S = 60.0
#: Reasons that may resolve on their own, each reported as a failure only once it lasted the grace above.
TRANSIENT_REASONS = frozenset({"Unschedulable"})


@dataclass(frozen=True)
class PodProblem:
    """Why a workspace's pod cannot run.

    Attributes:
        reason: a machine word (``ImagePullBackOff``, ``Unschedulable``).
        message: the cluster's explanation.
        since: when the cause began (the condition's ``lastTransitionTime``), for :data:`TRANSIENT_REASONS`;
            None otherwise or when the cluster did not say.
    """

    reason: str
    message: str
    since: datetime | None = None

    def lasting(self, now: datetime, grace_s: float = UNSCHEDULABLE_GRACE_S) -> bool:
        """Whether the problem is a failure at ``now`` (timezone-aware).

        Always, except a transient reason (:data:`TRANSIENT_REASONS`) that began less than ``grace_s`` seconds
        ago.
        """
        if self.reason not in TRANSIENT_REASONS or self.since is None:
            return True
        return (now - self.since).total_seconds() >= grace_s


def _timestamp(value: object) -> datetime | None:
    # Kubernetes writes RFC 3339 in UTC ("2026-11-26T15:55:03Z"); anything else counts as unknown.
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """The first problem of a pod that means it cannot run on its own, or None.

    Container waiting reasons (image pull, crash loop, config errors), the last termination of a restarting
    container (``Error``, ``OOMKilled``), then ``PodScheduled=False`` with ``Unschedulable`` (with its
    ``lastTransitionTime`` as ``since``: see :meth:`PodProblem.lasting`).
    """
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FAILING_POD_REASONS:
                return PodProblem(str(waiting["reason"]), str(waiting.get("message") or "")[:_MAX_MESSAGE])
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated.get("reason") in FAILING_POD_REASONS and container.get("restartCount", 0) > 0:
                return PodProblem(str(terminated["reason"]), str(terminated.get("message") or "")[:_MAX_MESSAGE])
    for condition in status.get("conditions") or []:
        unschedulable = condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
        if condition.get("type") == "PodScheduled" and unschedulable:
            message = str(condition.get("message") or "")[:_MAX_MESSAGE]
            return PodProblem("Unschedulable", message, _timestamp(condition.get("lastTransitionTime")))
    return None


_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "annotations")


def _compact(deployment: dict[str, Any]) -> dict[str, Any]:
    """What the hub reads of a Deployment, and its identity.

    The hub reads ``metadata.resourceVersion``, ``spec.replicas`` and ``status`` (reference §1.3); the pod
    template and managed fields are dropped, so a thousand workspaces stay small.
    """
    metadata = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    return {
        "apiVersion": deployment.get("apiVersion", "apps/v1"),
        "kind": deployment.get("kind", "Deployment"),
        "metadata": {key: metadata[key] for key in _KEPT_METADATA if key in metadata},
        "spec": {key: spec[key] for key in ("replicas", "paused", "progressDeadlineSeconds") if key in spec},
        "status": deployment.get("status") or {},
    }


class _Deployments:
    def __init__(self, notify: Callable[[], None], changed: asyncio.Event) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.synced = False
        self.last_error = ""
        self._notify = notify
        self._changed = changed

    def on_upsert(self, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        self.objects[(str(metadata.get("namespace", "")), str(metadata.get("name", "")))] = _compact(obj)
        self._changed.set()

    def on_delete(self, namespace: str, name: str) -> None:
        if self.objects.pop((namespace, name), None) is not None:
            self._changed.set()

    def on_synced(self) -> None:
        self.synced = True
        self._notify()

    def on_error(self, error: KubeError) -> None:
        self.last_error = str(error)


class _Pods:
    def __init__(self, notify: Callable[[], None], changed: asyncio.Event) -> None:
        self._notify = notify
        self._changed = changed
        # (namespace, workspace id) -> pod name -> problem; pods without a problem are not kept.
        self.problems: dict[tuple[str, str], dict[str, PodProblem]] = {}
        self.workspace_of: dict[tuple[str, str], str] = {}
        self.synced = False

    def on_upsert(self, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
        workspace_id = str((metadata.get("annotations") or {}).get(WORKSPACE_ID_ANNOTATION, ""))
        had_problem = self._forget(namespace, name)
        problem = pod_problem(obj)
        if problem is not None:
            self.workspace_of[(namespace, name)] = workspace_id
            self.problems.setdefault((namespace, workspace_id), {})[name] = problem
            self._changed.set()
        elif had_problem:
            self._changed.set()  # the problem went away (the pod got scheduled at last): report it early too

    def on_delete(self, namespace: str, name: str) -> None:
        self._forget(namespace, name)

    def _forget(self, namespace: str, name: str) -> bool:
        """Forget the pod's problem; True if it had one."""
        workspace_id = self.workspace_of.pop((namespace, name), None)
        if workspace_id is not None:
            pods = self.problems.get((namespace, workspace_id), {})
            pods.pop(name, None)
            if not pods:
                self.problems.pop((namespace, workspace_id), None)
        return workspace_id is not None

    def on_synced(self) -> None:
        self.synced = True
        self._notify()

    def on_error(self, error: KubeError) -> None:
        pass


class WorkspaceInformer:
    """The Deployments and pod problems of one agent's workspaces.

    Args:
        client: API client.
        agent_id: selects ``agent.gitlab.com/id=<agent_id>``.
    """

    def __init__(self, client: KubeClient, agent_id: int) -> None:
        selector = f"{AGENT_ID_LABEL}={agent_id}"
        self._ready = asyncio.Event()
        #: Set whenever a workspace's Deployment or pod problem changes (the worker may reconcile early).
        self.changed = asyncio.Event()
        self._deployments = _Deployments(self._check_ready, self.changed)
        self._pods = _Pods(self._check_ready, self.changed)
        self._reflectors = [
            Reflector(client, "/apis/apps/v1/deployments", self._deployments, label_selector=selector),
            Reflector(client, "/api/v1/pods", self._pods, label_selector=selector),
        ]

    def start(self) -> None:
        """Start both watches."""
        for reflector in self._reflectors:
            reflector.start()

    async def stop(self) -> None:
        """Stop both watches."""
        for reflector in self._reflectors:
            await reflector.stop()

    def _check_ready(self) -> None:
        if self.synced:
            self._ready.set()

    async def wait_synced(self, timeout_s: float) -> bool:
        """Wait until both watches listed everything, at most ``timeout_s`` seconds; True if they did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        return self.synced

    @property
    def synced(self) -> bool:
        """True once both have listed everything (the reconciler waits for it, as upstream)."""
        return self._deployments.synced and self._pods.synced

    @property
    def last_error(self) -> str:
        """The last list/watch failure of the Deployments watch ("" if none)."""
        return self._deployments.last_error

    def deployments(self) -> list[dict[str, Any]]:
        """Every Deployment in the cache."""
        return list(self._deployments.objects.values())

    def has_deployment(self, namespace: str, name: str) -> bool:
        """Whether the Deployment is in the cache."""
        return (namespace, name) in self._deployments.objects

    def problem(self, namespace: str, workspace_id: str) -> PodProblem | None:
        """The first pod problem of the workspace, or None."""
        pods = self._pods.problems.get((namespace, workspace_id))
        return next(iter(pods.values())) if pods else None
