"""Include-config (vectors §V3), finder (§V4) and lifecycle (§V5) rules, as transcribed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tether.modules.remote_development.hub import rules
from tether.modules.remote_development.hub.rules import (
    Inclusion,
    Timestamps,
    desired_after_report,
    inclusion,
    lifecycle_desired,
    replicas_for,
    returned_by_full,
    returned_by_partial,
)
from tether.modules.remote_development.states import State

T0 = datetime(2026, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
S = timedelta(seconds=1)
R = T0 - 2 * H


def ts(
    desired: str = "Running",
    actual: str = "Running",
    dsu_at: datetime = R - H,
    asu_at: datetime = R - H,
    responded: datetime | None = R,
    force: bool = False,
) -> Timestamps:
    return Timestamps(desired, actual, dsu_at, asu_at, responded, force)


def flags(fia: bool, dsu: bool, asu: bool, tnt: bool) -> Timestamps:
    return ts(
        desired="Terminated" if tnt else "Running",
        actual="Running",
        dsu_at=R + H if dsu else R - H,
        asu_at=R + H if asu else R - H,
        force=fia,
    )


# update_type, FIA, DSU, ASU, TNT -> type, cfg
V3 = [
    ("full", False, False, False, False, Inclusion.ALL),
    ("partial", True, True, False, False, Inclusion.ALL),
    ("partial", True, False, False, False, Inclusion.ALL),
    ("partial", False, True, False, False, Inclusion.PARTIAL),
    ("partial", False, False, False, False, Inclusion.NONE),
    ("partial", False, False, False, True, Inclusion.PARTIAL),
    ("partial", True, True, True, False, Inclusion.ALL),
    ("partial", True, False, True, False, Inclusion.ALL),
    ("partial", False, True, True, False, Inclusion.ALL),
    ("partial", False, False, True, False, Inclusion.ALL),
]


@pytest.mark.parametrize(("update_type", "fia", "dsu", "asu", "tnt", "expected"), V3)
def test_v3_include_config(update_type: str, fia: bool, dsu: bool, asu: bool, tnt: bool, expected: Inclusion) -> None:
    ws = flags(fia, dsu, asu, tnt)
    assert (ws.desired_updated_since_response, ws.actual_updated_since_response, ws.terminated_not_yet) == (
        dsu,
        asu,
        tnt,
    )
    assert inclusion(update_type, ws) is expected
    assert expected.value in {"all_resources_included", "partial_resources_included", "no_resources_included"}


def test_v3_predicates_strict_and_null() -> None:
    never = ts(responded=None)
    assert never.desired_updated_since_response and never.actual_updated_since_response
    equal = ts(dsu_at=R, asu_at=R)
    assert not equal.desired_updated_since_response and not equal.actual_updated_since_response
    assert inclusion("partial", never) is Inclusion.ALL


def v4_rows() -> list[tuple[str, Timestamps, bool]]:
    r2 = T0 - S
    return [
        ("W1", ts("Stopped", "Stopped"), False),
        ("W2", ts("Terminated", "Terminated"), False),
        ("W3", ts("Terminated", "Terminating", asu_at=T0), False),
        ("W4", ts("Running", "Running", asu_at=T0), False),
        ("W5", ts("Stopped", "Stopped", asu_at=T0), True),
        ("W6", ts("Stopped", "Stopped", dsu_at=R + H, asu_at=T0 - 3 * H), False),
        ("W7", ts("Stopped", "Stopped", dsu_at=R - H, asu_at=R + H), False),
        ("W8", ts("Stopped", "Stopped", dsu_at=r2 - 2 * S, asu_at=T0 - 2 * S, responded=r2, force=True), False),
    ]


def test_v4_finder() -> None:
    rows = v4_rows()
    assert [n for n, ws, _ in rows if returned_by_full(ws)] == ["W1", "W3", "W4", "W5", "W6", "W7", "W8"]
    assert [n for n, ws, rep in rows if returned_by_partial(ws, rep)] == ["W3", "W4", "W5", "W6", "W7", "W8"]


def test_v4_derived() -> None:
    assert returned_by_partial(ts("Stopped", "Stopped", responded=None), False)
    assert not returned_by_partial(ts("Stopped", "Stopped", dsu_at=R), False)  # strict >
    assert not returned_by_full(ts("Terminated", "Terminated"))
    assert returned_by_full(ts("Running", "Terminated"))


NOW = datetime(2021, 1, 1, tzinfo=UTC)
AGE = NOW - 8760 * H

V5 = [
    ("just created", NOW, NOW, "Running", "Running"),
    ("at max active hours", NOW - 36 * H + S, NOW - 36 * H + S, "Running", "Running"),
    ("max age, desired just updated", AGE, NOW, "Running", "Running"),
    ("hard cap exceeded", AGE - S, NOW, "Running", "Terminated"),
    ("hard cap exceeded, already terminated", AGE - S, NOW, "Terminated", "Terminated"),
    ("active limit exceeded", AGE, NOW - 36 * H - S, "Running", "Stopped"),
    ("active limit exceeded, restart requested", AGE, NOW - 36 * H - S, "RestartRequested", "Stopped"),
    ("active limit exceeded, already stopped", AGE, NOW - 36 * H - S, "Stopped", "Stopped"),
    ("active limit exceeded, already terminated", AGE, NOW - 36 * H - S, "Terminated", "Terminated"),
    ("stopped limit exceeded", AGE, NOW - 744 * H - S, "Stopped", "Terminated"),
    ("stopped limit exactly reached", AGE, NOW - 744 * H, "Stopped", "Stopped"),
    ("stopped limit exceeded, already terminated", AGE, NOW - 744 * H - S, "Terminated", "Terminated"),
]


@pytest.mark.parametrize(("scenario", "created", "updated", "before", "after"), V5, ids=[v[0] for v in V5])
def test_v5_lifecycle(scenario: str, created: datetime, updated: datetime, before: str, after: str) -> None:
    assert lifecycle_desired(before, created, updated, NOW, 36, 744) == after


def test_restart_flip_and_replicas() -> None:
    assert desired_after_report("RestartRequested", "Stopped") == "Running"
    assert desired_after_report("RestartRequested", "Stopping") == "RestartRequested"
    assert desired_after_report("Stopped", "Stopped") == "Stopped"
    assert [replicas_for(s) for s in ("Running", "RestartRequested", "Stopped")] == [1, 0, 0]


def test_error_workspaces_are_retried_unless_refused_as_invalid() -> None:
    """Tether (issue 23 item 4): Error is retried at every partial update, except objects refused as invalid."""
    quota = 'deployments.apps "x" is forbidden: exceeded quota: q'
    invalid = 'Deployment.apps "x" is invalid: spec.template.spec.containers[0].ports[0].name: Invalid value'
    assert rules.retries_apply(State.RUNNING, State.ERROR, rules.error_text(quota))
    assert rules.retries_apply(State.STOPPED, State.ERROR, quota)
    assert not rules.retries_apply(State.TERMINATED, State.ERROR, quota)  # already returned until Terminated
    assert not rules.retries_apply(State.RUNNING, State.ERROR, rules.error_text(invalid))
    assert not rules.retries_apply(State.RUNNING, State.FAILED, quota)
    assert "terminate this workspace" in rules.error_text(invalid)
    assert rules.error_text("").startswith("agentk reported an error without a message (agentk applies")
