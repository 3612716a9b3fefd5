"""One reconciler: builds each reconcile request and carries out each answer (reference §5.4-§5.6).

A reconciler lives from one full sync to the next: its first run sends ``update_type: full`` with every
workspace, later runs ``partial`` with only what the hub has not acknowledged. Trackers:

* acknowledged resource versions (name -> the ``deployment_resource_version`` the hub echoed);
* terminations in progress (name -> namespace, and whether agentk deletes the namespace);
* apply errors not yet delivered (name -> message), deleted once the hub has answered for the workspace or
  when a later apply of the workspace succeeds (upstream's versioned error tracker);
* pod problems already reported (name -> reason, and whether lasting), so a new problem, or one that has now
  lasted long enough to be a failure, is sent even when the Deployment did not change (Tether's fast failure).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
import structlog

from tether.kube.client import KubeApiError, KubeClient, KubeError
from tether.modules.remote_development import AGENT_ID_LABEL
from tether.modules.remote_development.agent.applier import Applier
from tether.modules.remote_development.agent.informer import (
    UNSCHEDULABLE_GRACE_S,
    WORKSPACE_ID_ANNOTATION,
    WorkspaceInformer,
)
from tether.modules.remote_development.protocol import (
    UPDATE_FULL,
    UPDATE_PARTIAL,
    ErrorDetails,
    PodFailure,
    ReconcileRequest,
    ReconcileResponse,
    WorkspaceAgentInfo,
    WorkspaceRailInfo,
)
from tether.modules.remote_development.states import State

_log = structlog.get_logger(__name__)
#: Annotation agentk puts on namespaces it creates: the workspace it made it for (it deletes only those).
NAMESPACE_OWNER_ANNOTATION = "workspaces.gitlab.com/workspace-name"
#: Workspaces applied at the same time.
APPLY_CONCURRENCY = 8

#: Sends one reconcile request, returns the decoded 201 answer (raises on anything else).
Send = Callable[[ReconcileRequest], Awaitable[ReconcileResponse]]


@dataclass
class _Termination:
    namespace: str
    owns_namespace: bool
    progress: str = State.TERMINATING


class Reconciler:
    """State between one full sync and the next.

    Args:
        client: API client.
        informer: the (started, synced) watch of the agent's workspaces.
        agent_id: the agent's id (label on created namespaces).
        unschedulable_grace_s: how long a pod may stay unschedulable before it is reported as a failure
            (:meth:`PodProblem.lasting`).
    """

    def __init__(
        self,
        client: KubeClient,
        informer: WorkspaceInformer,
        agent_id: int,
        unschedulable_grace_s: float = UNSCHEDULABLE_GRACE_S,
    ) -> None:
        self._client = client
        self._unschedulable_grace_s = unschedulable_grace_s
        self._informer = informer
        self._agent_id = agent_id
        self._applier = Applier(client)
        self._acknowledged: dict[str, str] = {}
        self._terminations: dict[str, _Termination] = {}
        self._errors: dict[str, tuple[str, str]] = {}  # name -> (namespace, message)
        self._reported_problems: dict[str, str] = {}
        self._applied: dict[str, str] = {}  # name -> digest of the last config applied without error
        self.full_done = False

    async def build_request(self) -> ReconcileRequest:
        """The next reconcile request: ``full`` until one full run succeeded, then ``partial``."""
        infos: dict[str, WorkspaceAgentInfo] = {}
        now = datetime.now(UTC)
        for deployment in self._informer.deployments():
            meta = deployment.get("metadata") or {}
            name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
            workspace_id = str((meta.get("annotations") or {}).get(WORKSPACE_ID_ANNOTATION, ""))
            problem = self._informer.problem(namespace, workspace_id)
            lasting = problem is not None and problem.lasting(now, self._unschedulable_grace_s)
            problem_key = f"{problem.reason}: {problem.message} ({lasting})" if problem else ""
            unchanged = self._acknowledged.get(name) == str(meta.get("resourceVersion", ""))
            if self.full_done and unchanged and self._reported_problems.get(name, "") == problem_key:
                continue
            info = WorkspaceAgentInfo(name, namespace, latest_k8s_deployment_info=deployment)
            if problem is not None:
                # lasting false: a cause that may resolve on its own, not a failure yet (the hub says Starting).
                info.pod_failure = PodFailure(problem.reason, problem.message, lasting)
            self._reported_problems[name] = problem_key
            infos[name] = info
        for name, termination in self._terminations.items():
            termination.progress = await self._termination_progress(name, termination)
            info = infos.setdefault(name, WorkspaceAgentInfo(name, termination.namespace))
            info.termination_progress = termination.progress
        for name, (namespace, message) in self._errors.items():
            info = infos.setdefault(name, WorkspaceAgentInfo(name, namespace))
            info.error_details = ErrorDetails("applier", message)
        return ReconcileRequest(UPDATE_PARTIAL if self.full_done else UPDATE_FULL, list(infos.values()))

    async def _termination_progress(self, name: str, termination: _Termination) -> str:
        if termination.owns_namespace:
            try:
                await self._client.get_json(f"/api/v1/namespaces/{termination.namespace}")
            except KubeApiError as exc:
                if exc.status == 404:
                    return State.TERMINATED
                raise
            return State.TERMINATING
        gone = not self._informer.has_deployment(termination.namespace, name)
        return State.TERMINATED if gone else State.TERMINATING

    async def run(self, send: Send) -> int:
        """One cycle: build, send, carry out the answer. Returns how many workspaces the hub answered for.

        Raises:
            Exception: whatever ``send`` raises (the caller logs it and tries again next tick); nothing of
                the answer is applied then.
        """
        body = await self.build_request()
        sent_errors = {info.name for info in body.workspace_agent_infos if info.error_details is not msgspec.UNSET}
        answer = await send(body)
        infos = answer.workspace_rails_infos
        semaphore = asyncio.Semaphore(APPLY_CONCURRENCY)

        async def handle(info: WorkspaceRailInfo) -> None:
            async with semaphore:
                await self._handle(info, info.name in sent_errors)

        await asyncio.gather(*(handle(info) for info in infos))
        self.full_done = True
        return len(infos)

    async def _handle(self, info: WorkspaceRailInfo, error_delivered: bool) -> None:
        name, namespace = info.name, info.namespace
        version = info.deployment_resource_version
        if version is not None:
            self._acknowledged[name] = version
        else:
            # The hub holds no version (a new workspace, or an Error one it wants re-reported): the next partial
            # run sends the Deployment even if unchanged (upstream stores "" for null, with the same effect).
            self._acknowledged.pop(name, None)
        if error_delivered:
            self._errors.pop(name, None)
        config = info.config_to_apply or ""
        try:
            if info.desired_state == State.TERMINATED:
                await self._terminate(name, namespace, info.actual_state, config)
                return
            self._terminations.pop(name, None)
            await self._ensure_namespace(name, namespace)
            if config:
                await self._apply(name, namespace, config)
        except KubeError as exc:
            self._errors[name] = (namespace, str(exc))
            _log.warning("workspace_kubernetes_error", workspace=name, error=str(exc))

    async def _apply(self, name: str, namespace: str, config: str) -> None:
        digest = hashlib.sha256(config.encode()).hexdigest()
        if self._applied.get(name) == digest:
            return  # already applied in this reconciler's life; a full sync applies everything again
        errors = await self._applier.apply(config, namespace)
        if errors:
            self._applied.pop(name, None)
            self._errors[name] = (namespace, "; ".join(errors)[:4096])
            _log.warning("workspace_apply_failed", workspace=name, errors=errors)
        else:
            self._applied[name] = digest
            self._errors.pop(name, None)  # a newer apply succeeded: an undelivered older error is stale

    async def _terminate(self, name: str, namespace: str, actual: str, config: str) -> None:
        if actual == State.TERMINATED:
            # The hub has recorded it: forget the workspace for good.
            for tracker in (self._terminations, self._acknowledged, self._reported_problems, self._applied):
                tracker.pop(name, None)
            self._errors.pop(name, None)
            return
        if name in self._terminations:
            return
        owns = await self._owns_namespace(name, namespace)
        if owns:
            try:
                await self._client.send_json("DELETE", f"/api/v1/namespaces/{namespace}")
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
        elif config:
            await self._apply(name, namespace, config)  # empty inventories prune everything (shared namespace)
        self._terminations[name] = _Termination(namespace, owns)

    async def _owns_namespace(self, name: str, namespace: str) -> bool:
        try:
            found = await self._client.get_json(f"/api/v1/namespaces/{namespace}")
        except KubeApiError as exc:
            if exc.status == 404:
                return True  # nothing left to delete: reported Terminated next time
            raise
        return ((found.get("metadata") or {}).get("annotations") or {}).get(NAMESPACE_OWNER_ANNOTATION) == name

    async def _ensure_namespace(self, name: str, namespace: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {AGENT_ID_LABEL: str(self._agent_id)},
                "annotations": {NAMESPACE_OWNER_ANNOTATION: name},
            },
        }
        try:
            await self._client.get_json(f"/api/v1/namespaces/{namespace}")
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            try:
                await self._client.send_json("POST", "/api/v1/namespaces", body)
            except KubeApiError as create_error:
                if create_error.status != 409:  # AlreadyExists: fine
                    raise
