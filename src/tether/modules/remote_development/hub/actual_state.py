"""The actual state of a workspace, calculated from what agentk reports (reference §3.2, R18 order).

:func:`calculate` is upstream's calculator rule for rule. :func:`explain_failure` is Tether's addition (issue
12 "failure explained fast"): a readable reason taken from the Deployment's conditions and the pod problems
agentk attaches, so a Deployment that cannot progress shows ``Failed`` at once rather than after the
Deployment's progress deadline.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.modules.remote_development.protocol import FAILING_POD_REASONS
from tether.modules.remote_development.states import State

_PROGRESSING_ROLLOUT = frozenset({"NewReplicaSetCreated", "FoundNewReplicaSet", "ReplicaSetUpdated"})
_AVAILABLE_REASONS = frozenset({"MinimumReplicasAvailable", "MinimumReplicasUnavailable"})


def _condition(conditions: list[Any], kind: str) -> Mapping[str, Any] | None:
    # The first condition of a type counts when several share it (reference §3.2 notes).
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return None


def _count(status: Mapping[str, Any], key: str) -> Any:
    value = status.get(key)
    return 0 if value is None else value


def calculate(
    deployment: Mapping[str, Any] | None,
    termination_progress: str | None = None,
    error_details: object = None,
) -> State:
    """The actual state from one ``workspace_agent_info`` (reference §3.2; first matching rule wins).

    Args:
        deployment: ``latest_k8s_deployment_info`` (the whole Deployment as JSON) or None.
        termination_progress: None, ``Terminating`` or ``Terminated``.
        error_details: any truthy value means agentk reported an error.

    Only ``spec.replicas``, ``status.conditions[].type/reason`` and ``status.available/unavailableReplicas``
    are read; condition ``status`` is ignored, as upstream does.
    """
    if termination_progress == State.TERMINATED:
        return State.TERMINATED
    if error_details:
        return State.ERROR
    if termination_progress == State.TERMINATING:
        return State.TERMINATING
    if not isinstance(deployment, Mapping):
        return State.UNKNOWN
    spec, status = deployment.get("spec"), deployment.get("status")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        return State.UNKNOWN
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return State.UNKNOWN
    progressing = _condition(conditions, "Progressing")
    if progressing is None:
        return State.UNKNOWN
    progress_reason = progressing.get("reason")
    replicas = spec.get("replicas")
    if progress_reason is None or replicas is None:
        return State.UNKNOWN
    if progress_reason == "ProgressDeadlineExceeded":
        return State.FAILED
    if progress_reason in _PROGRESSING_ROLLOUT:
        if replicas == 0:
            return State.STOPPING
        if replicas == 1:
            return State.STARTING
    available = _count(status, "availableReplicas")
    unavailable = _count(status, "unavailableReplicas")
    available_condition = _condition(conditions, "Available")
    if available_condition is None or available_condition.get("reason") is None:
        return State.UNKNOWN
    available_reason = available_condition["reason"]
    if progress_reason == "NewReplicaSetAvailable":
        if available_reason == "MinimumReplicasAvailable":
            if replicas == 0 and available == 0:
                return State.STOPPED
            if replicas == available and unavailable == 0:
                return State.RUNNING
            if replicas == 0 and available == 1:
                return State.STOPPING
        if available_reason in _AVAILABLE_REASONS and replicas == 1 and available == 0:
            return State.STARTING
    return State.UNKNOWN


@dataclass(frozen=True)
class Failure:
    """Why a workspace cannot run, in words a user can read.

    Attributes:
        reason: a short machine word (``ImagePullBackOff``, ``FailedCreate``, ``ProgressDeadlineExceeded``).
        message: the cluster's explanation (may be empty).
    """

    reason: str
    message: str

    def text(self) -> str:
        """``reason: message`` (or only the reason)."""
        return f"{self.reason}: {self.message}" if self.message else self.reason


def _pod_failure(pod_failure: Mapping[str, Any] | None) -> Failure | None:
    if isinstance(pod_failure, Mapping) and pod_failure.get("reason") in FAILING_POD_REASONS:
        return Failure(str(pod_failure["reason"]), str(pod_failure.get("message") or "")[:1024])
    return None


def _lasting(pod_failure: Mapping[str, Any]) -> bool:
    # Absent means lasting: agentk before the flag, and every reason but a transient one, report failures.
    return pod_failure.get("lasting") is not False


#: The admission refusal a pod gets while the workspace's own ServiceAccount, applied in the same run as its
#: Deployment, is not yet in the API server's cache: the ReplicaSet controller retries and it passes.
_ACCOUNT_NOT_FOUND = re.compile(r'serviceaccount "[^"]*" not found')


def _own_account_pending(condition: Mapping[str, Any]) -> bool:
    return condition.get("reason") == "FailedCreate" and bool(_ACCOUNT_NOT_FOUND.search(str(condition.get("message"))))


def explain_failure(deployment: Mapping[str, Any] | None, pod_failure: Mapping[str, Any] | None) -> Failure | None:
    """The failure a user should see, or None when nothing is known to be wrong (Tether addition).

    Args:
        deployment: ``latest_k8s_deployment_info`` or None.
        pod_failure: Tether's ``pod_failure`` of a workspace_agent_info, ``{"reason", "message", "lasting"}``
            taken by agentk from the workspace's pods (waiting/terminated container reasons, unschedulable), or
            None. ``lasting: false`` marks a cause that may still resolve on its own (a pod unschedulable for
            less than agentk's grace, e.g. while its claim binds): not a failure by itself.

    Sources, in order: the Deployment's ``ReplicaFailure`` condition (quota, admission: pods cannot even be
    created; not the missing-ServiceAccount refusal of a first start, which passes on its own), then a lasting
    pod problem whose reason is one of :data:`FAILING_POD_REASONS` (specific for as long as the cause lasts),
    then ``Progressing`` with ``ProgressDeadlineExceeded`` (named by the pod's own reason when agentk reports
    one, lasting or not: the deadline has decided it lasted).
    """
    conditions: list[Any] = []
    if isinstance(deployment, Mapping) and isinstance(deployment.get("status"), Mapping):
        found = deployment["status"].get("conditions")
        conditions = found if isinstance(found, list) else []
    replica_failure = _condition(conditions, "ReplicaFailure")
    if (
        replica_failure is not None
        and replica_failure.get("status") == "True"
        and not _own_account_pending(replica_failure)
    ):
        return Failure(
            str(replica_failure.get("reason") or "ReplicaFailure"), str(replica_failure.get("message") or "")
        )
    # The pod's own reason comes before the Deployment's deadline: once the deadline passes (600 s by default,
    # 120 s in tests) it would otherwise replace "ImagePullBackOff: ..." with a generic word while the cause lasts.
    pod = _pod_failure(pod_failure)
    if pod is not None and pod_failure is not None and _lasting(pod_failure):
        return pod
    progressing = _condition(conditions, "Progressing")
    if progressing is not None and progressing.get("reason") == "ProgressDeadlineExceeded":
        return pod or Failure("ProgressDeadlineExceeded", str(progressing.get("message") or ""))
    return None


def waiting_reason(pod_failure: Mapping[str, Any] | None) -> str:
    """What a workspace still ``Starting`` waits on, when agentk reports a cause that is not lasting yet, or "".

    The reason stays specific while it lasts (issue 23 item 4): ``Unschedulable: 0/1 nodes are available: pod
    has unbound immediate PersistentVolumeClaims (waiting: a failure if it lasts)``.
    """
    pod = _pod_failure(pod_failure)
    if pod is None or pod_failure is None or _lasting(pod_failure):
        return ""
    return f"{pod.text()} (waiting: a failure if it lasts)"


def calculate_with_failure(
    deployment: Mapping[str, Any] | None,
    termination_progress: str | None,
    error_details: object,
    pod_failure: Mapping[str, Any] | None,
) -> tuple[State, Failure | None]:
    """:func:`calculate`, then Tether's fast failure.

    A workspace upstream would still call ``Starting`` (or ``Unknown`` with a Deployment) becomes ``Failed``
    when :func:`explain_failure` finds a reason.

    Returns:
        (state, failure): failure is set only when the state is ``Failed``; a cause not lasting yet leaves the
        state as calculated (see :func:`waiting_reason` for its words).
    """
    state = calculate(deployment, termination_progress, error_details)
    if state in (State.STARTING, State.UNKNOWN, State.FAILED) and deployment is not None:
        failure = explain_failure(deployment, pod_failure)
        if failure is not None:
            return State.FAILED, failure
    return state, None
