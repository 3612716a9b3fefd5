"""The actual-state calculator: every rule of reference §3.2 in R18 order, and Tether's failure reasons.

The upstream vectors for this calculator (V1/V2) are held back; these cases come from the rules themselves,
one per rule and branch, plus the precedence cases the order implies.
"""

from __future__ import annotations

from typing import Any

import pytest

from tether.modules.remote_development.hub.actual_state import (
    Failure,
    calculate,
    calculate_with_failure,
    explain_failure,
    waiting_reason,
)
from tether.modules.remote_development.states import ACTUAL_STATES, DESIRED_STATES, State


def dep(
    cond: list[str] | None,
    replicas: int | None = 1,
    avail: int | None = None,
    unavail: int | None = None,
    rv: str = "1",
) -> dict[str, Any]:
    """A Deployment with ``cond`` as ``Type/Reason`` strings (``Type`` alone: no reason)."""
    status: dict[str, Any] = {}
    if cond is not None:
        status["conditions"] = [
            {"type": c.split("/")[0], **({"reason": c.split("/")[1]} if "/" in c else {}), "status": "True"}
            for c in cond
        ]
    if avail is not None:
        status["availableReplicas"] = avail
    if unavail is not None:
        status["unavailableReplicas"] = unavail
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"resourceVersion": rv},
        "spec": spec,
        "status": status,
    }


P_AVAIL = "Progressing/NewReplicaSetAvailable"
A_MIN = "Available/MinimumReplicasAvailable"
A_UNAV = "Available/MinimumReplicasUnavailable"


def test_eleven_states_ten_actual_four_desired() -> None:
    assert len(State) == 11
    assert State.RESTART_REQUESTED not in ACTUAL_STATES and len(ACTUAL_STATES) == 10
    assert {s.value for s in DESIRED_STATES} == {"Running", "RestartRequested", "Stopped", "Terminated"}


@pytest.mark.parametrize(
    ("deployment", "termination", "error", "expected"),
    [
        # rule 1: Terminated wins over everything, even an error
        (None, "Terminated", {"error_type": "applier"}, State.TERMINATED),
        (dep([P_AVAIL, A_MIN], 1, 1), "Terminated", None, State.TERMINATED),
        # rule 2: an error beats Terminating and any status
        (None, "Terminating", {"error_type": "applier", "error_message": "x"}, State.ERROR),
        (dep([P_AVAIL, A_MIN], 1, 1), None, {"error_type": "kubernetes"}, State.ERROR),
        # rule 3
        (None, "Terminating", None, State.TERMINATING),
        (dep([P_AVAIL, A_MIN], 1, 1), "Terminating", None, State.TERMINATING),
        # rule 4: nothing reported
        (None, None, None, State.UNKNOWN),
        # rule 5: no spec / status / conditions
        ({"spec": {"replicas": 1}}, None, None, State.UNKNOWN),
        ({"status": {"conditions": []}}, None, None, State.UNKNOWN),
        (dep(None), None, None, State.UNKNOWN),
        # rule 6: no Progressing condition
        (dep([A_MIN], 1, 1), None, None, State.UNKNOWN),
        (dep([]), None, None, State.UNKNOWN),
        # rule 7: Progressing without reason, or no spec.replicas
        (dep(["Progressing", A_MIN], 1, 1), None, None, State.UNKNOWN),
        (dep([P_AVAIL, A_MIN], None, 1), None, None, State.UNKNOWN),
        # rule 8: deadline exceeded is Failed whatever the rest says
        (dep(["Progressing/ProgressDeadlineExceeded"], 1), None, None, State.FAILED),
        (dep(["Progressing/ProgressDeadlineExceeded", A_MIN], 0, 0), None, None, State.FAILED),
        # rule 9: a rollout in progress
        (dep(["Progressing/NewReplicaSetCreated"], 0), None, None, State.STOPPING),
        (dep(["Progressing/FoundNewReplicaSet"], 1), None, None, State.STARTING),
        (dep(["Progressing/ReplicaSetUpdated", A_UNAV], 1, 0, 1), None, None, State.STARTING),
        (dep(["Progressing/ReplicaSetUpdated", A_MIN], 0, 1), None, None, State.STOPPING),
        # rule 9, other replica counts fall through (to Unknown here: no Available condition)
        (dep(["Progressing/ReplicaSetUpdated"], 2), None, None, State.UNKNOWN),
        # rule 11: no Available condition, or no reason
        (dep([P_AVAIL], 1, 1), None, None, State.UNKNOWN),
        (dep([P_AVAIL, "Available"], 1, 1), None, None, State.UNKNOWN),
        # rule 12: complete deployment
        (dep([P_AVAIL, A_MIN], 0, 0), None, None, State.STOPPED),
        (dep([P_AVAIL, A_MIN], 0), None, None, State.STOPPED),  # absent counts are 0
        (dep([P_AVAIL, A_MIN], 1, 1, 0), None, None, State.RUNNING),
        (dep([P_AVAIL, A_MIN], 1, 1), None, None, State.RUNNING),
        (dep([P_AVAIL, A_MIN], 0, 1), None, None, State.STOPPING),
        (dep([P_AVAIL, A_MIN], 1, 0), None, None, State.STARTING),
        (dep([P_AVAIL, A_UNAV], 1, 0, 1), None, None, State.STARTING),  # crash loop: Starting upstream
        # rule 13: anything else
        (dep([P_AVAIL, A_MIN], 1, 1, 1), None, None, State.UNKNOWN),
        (dep([P_AVAIL, A_UNAV], 0, 0), None, None, State.UNKNOWN),
        (dep([P_AVAIL, "Available/SomethingElse"], 1, 0), None, None, State.UNKNOWN),
        (dep(["Progressing/Unexpected", A_MIN], 1, 1), None, None, State.UNKNOWN),
    ],
)
def test_rules_in_order(deployment: Any, termination: str | None, error: Any, expected: State) -> None:
    assert calculate(deployment, termination, error) == expected


def test_condition_status_is_ignored_and_first_of_a_type_counts() -> None:
    d = dep([P_AVAIL, A_MIN, "Available/MinimumReplicasUnavailable"], 1, 1)
    for condition in d["status"]["conditions"]:
        condition["status"] = "False"
    assert calculate(d) == State.RUNNING
    assert calculate(dep(["Progressing/NewReplicaSetCreated", P_AVAIL, A_MIN], 1, 1)) == State.STARTING


def test_falsy_error_details_do_not_count() -> None:
    assert calculate(dep([P_AVAIL, A_MIN], 1, 1), None, {}) == State.RUNNING


def test_failure_reasons_tether() -> None:
    crash = dep([P_AVAIL, A_UNAV], 1, 0, 1)
    state, failure = calculate_with_failure(crash, None, None, {"reason": "ImagePullBackOff", "message": "no pull"})
    assert state == State.FAILED and failure is not None and failure.text() == "ImagePullBackOff: no pull"
    # Ordinary start-up (ContainerCreating) stays Starting.
    assert calculate_with_failure(crash, None, None, {"reason": "ContainerCreating"}) == (State.STARTING, None)
    quota = dep(["Progressing/ReplicaSetUpdated", "ReplicaFailure/FailedCreate"], 1)
    quota["status"]["conditions"][1]["message"] = 'pods "x" is forbidden: exceeded quota'
    state, failure = calculate_with_failure(quota, None, None, None)
    assert state == State.FAILED and failure is not None and "exceeded quota" in failure.message
    # The workspace's own ServiceAccount, applied with the Deployment, not yet seen by admission: it passes.
    account = dep(["Progressing/ReplicaSetUpdated", "ReplicaFailure/FailedCreate"], 1)
    account["status"]["conditions"][1]["message"] = (
        'pods "ws-1-abc" is forbidden: error looking up service account gl-rd-ns-1/ws-1: '
        'serviceaccount "ws-1" not found'
    )
    assert calculate_with_failure(account, None, None, None) == (State.STARTING, None)
    deadline = dep(["Progressing/ProgressDeadlineExceeded"], 1)
    assert explain_failure(deadline, None) == Failure("ProgressDeadlineExceeded", "")
    # Past the deadline the pod's own reason stays the one shown, as long as the pod reports it.
    still = explain_failure(deadline, {"reason": "ImagePullBackOff", "message": "registry.invalid/x: not found"})
    assert still == Failure("ImagePullBackOff", "registry.invalid/x: not found")
    # Running, stopped, terminating and errors are never turned into Failed.
    running = dep([P_AVAIL, A_MIN], 1, 1)
    assert calculate_with_failure(running, None, None, {"reason": "CrashLoopBackOff"}) == (State.RUNNING, None)
    assert calculate_with_failure(None, "Terminating", None, {"reason": "CrashLoopBackOff"})[0] == State.TERMINATING


UNBOUND = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."


def test_a_transient_cause_is_not_a_failure_but_its_reason_is_shown() -> None:
    """Issue 23 item 4: a pod unschedulable while its claim binds stays Starting, saying why; lasting, Failed."""
    starting = dep(["Progressing/ReplicaSetUpdated"], 1)
    waiting = {"reason": "Unschedulable", "message": UNBOUND, "lasting": False}
    assert calculate_with_failure(starting, None, None, waiting) == (State.STARTING, None)
    assert waiting_reason(waiting) == f"Unschedulable: {UNBOUND} (waiting: a failure if it lasts)"
    lasting = dict(waiting, lasting=True)
    assert calculate_with_failure(starting, None, None, lasting) == (State.FAILED, Failure("Unschedulable", UNBOUND))
    assert waiting_reason(lasting) == "" and waiting_reason(None) == ""
    # Without the flag (an older agentk) a pod problem is a failure, as before.
    assert calculate_with_failure(starting, None, None, {"reason": "Unschedulable"})[0] == State.FAILED
    # Past the Deployment's deadline the cause has lasted, whatever agentk thought: its own words are kept.
    deadline = dep(["Progressing/ProgressDeadlineExceeded"], 1)
    assert calculate_with_failure(deadline, None, None, waiting) == (State.FAILED, Failure("Unschedulable", UNBOUND))
