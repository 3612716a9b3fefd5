"""What agentk makes of a workspace pod's status: which problems are failures, and when (issue 23 item 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tether.modules.remote_development.agent.informer import UNSCHEDULABLE_GRACE_S, PodProblem, pod_problem

NOW = datetime(2026, 11, 26, 16, 0, tzinfo=UTC)


def unschedulable(since: str | None) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "unbound claims"}
    if since is not None:
        condition["lastTransitionTime"] = since
    return {"status": {"phase": "Pending", "conditions": [condition]}}


def test_unschedulable_is_a_failure_only_once_it_lasted_the_grace() -> None:
    problem = pod_problem(unschedulable("2026-11-26T15:59:30Z"))
    assert problem == PodProblem("Unschedulable", "unbound claims", NOW - timedelta(seconds=30))
    assert UNSCHEDULABLE_GRACE_S > 30 and not problem.lasting(NOW)
    assert problem.lasting(NOW + timedelta(seconds=UNSCHEDULABLE_GRACE_S))
    assert problem.lasting(NOW, grace_s=10)
    # No (or no readable) transition time: nothing says it is transient, so it counts.
    for since in (None, "yesterday", "2026-11-26T15:59:30"):
        found = pod_problem(unschedulable(since))
        assert found is not None and found.since is None and found.lasting(NOW)


def test_container_problems_count_at_once() -> None:
    pod = {
        "status": {
            "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}],
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
    }
    problem = pod_problem(pod)
    assert problem == PodProblem("ImagePullBackOff", "not found") and problem.lasting(NOW)
    assert (
        pod_problem({"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}})
        is None
    )
