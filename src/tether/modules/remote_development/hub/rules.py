"""The hub's reconcile rules as pure functions (reference §2 steps 5, 7, 8 and §3.3-§3.4; vectors §V3-§V5).

The hub applies them to database rows; tests apply them to the vectors directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from tether.modules.remote_development.protocol import UPDATE_FULL
from tether.modules.remote_development.states import State

#: Hard cap on a workspace's age (upstream ``MAX_HOURS_BEFORE_TERMINATION``).
MAX_HOURS_BEFORE_TERMINATION = 8760


@dataclass(frozen=True)
class Timestamps:
    """The timestamps and flags the rules read from a workspace.

    Attributes:
        desired_state, actual_state: current states.
        desired_state_updated_at, actual_state_updated_at: when each last changed.
        responded_to_agent_at: when the workspace was last sent to agentk; None if never.
        force_include_all_resources: send every resource next time.
    """

    desired_state: str
    actual_state: str
    desired_state_updated_at: datetime
    actual_state_updated_at: datetime
    responded_to_agent_at: datetime | None
    force_include_all_resources: bool

    @property
    def desired_updated_since_response(self) -> bool:
        """DSU: never sent, or desired state changed strictly after the last response (R18 ``>``)."""
        return self.responded_to_agent_at is None or self.desired_state_updated_at > self.responded_to_agent_at

    @property
    def actual_updated_since_response(self) -> bool:
        """ASU: never sent, or actual state changed strictly after the last response."""
        return self.responded_to_agent_at is None or self.actual_state_updated_at > self.responded_to_agent_at

    @property
    def terminated_not_yet(self) -> bool:
        """TNT: desired Terminated while actual is not Terminated."""
        return self.desired_state == State.TERMINATED and self.actual_state != State.TERMINATED


class Inclusion(StrEnum):
    """What ``config_to_apply`` carries for one workspace (upstream's observability labels)."""

    ALL = "all_resources_included"
    PARTIAL = "partial_resources_included"
    NONE = "no_resources_included"


def inclusion(update_type: str, ws: Timestamps) -> Inclusion:
    """Whether and how much config to send (reference §3.4; vectors §V3).

    All resources on a full update, when forced, or when the actual state changed (keeps the actual-state
    file fresh); the partial set when only the desired state changed or a termination is pending; none
    otherwise (the rail_info is still returned as an acknowledgement).
    """
    if update_type == UPDATE_FULL or ws.force_include_all_resources or ws.actual_updated_since_response:
        return Inclusion.ALL
    if ws.desired_updated_since_response or ws.terminated_not_yet:
        return Inclusion.PARTIAL
    return Inclusion.NONE


def returned_by_full(ws: Timestamps) -> bool:
    """A full update returns every workspace not terminated on both sides (reference §2 step 8)."""
    return ws.desired_state != State.TERMINATED or ws.actual_state != State.TERMINATED


def returned_by_partial(ws: Timestamps, reported: bool) -> bool:
    """A partial update returns the union of reference §2 step 8 (a)-(e); ``reported``: in this request."""
    return (
        ws.desired_updated_since_response
        or ws.actual_updated_since_response
        or ws.terminated_not_yet
        or reported
        or ws.force_include_all_resources
    )


#: How the API server words a refusal of invalid objects (apimachinery's ``StatusReasonInvalid``, HTTP 422):
#: ``<Kind> "<name>" is invalid: <causes>``. No retry changes it: the objects come from the devfile.
INVALID_MARK = " is invalid: "


def refused_as_invalid(error_message: str) -> bool:
    """Whether an apply error is the API server refusing the workspace's objects as invalid (see above)."""
    return INVALID_MARK in error_message


def retries_apply(desired: str, actual: str, error_message: str) -> bool:
    """Tether: an ``Error`` workspace goes back to agentk, with every resource, at every partial update.

    Upstream returns an ``Error`` workspace once (its actual state changed) and then only at the hourly full
    update, so a cause fixed in the cluster (a quota, an admission webhook, agentk's RBAC, the API server
    back) leaves it ``Error`` for up to an hour. Seed 003 ("Workspace states"): the reconciliation "will
    continually attempt to transition the actual_state to the desired_state value, unless the workspace is
    in an unrecoverable state". Objects refused as invalid (:func:`refused_as_invalid`) are unrecoverable
    (a devfile never changes), and a workspace desired ``Terminated`` is already returned until it is.
    """
    return actual == State.ERROR and desired != State.TERMINATED and not refused_as_invalid(error_message)


def error_text(error_message: str) -> str:
    """The reason an ``Error`` workspace shows: agentk's error and what happens next or what the user must do."""
    error_message = error_message or "agentk reported an error without a message"
    if refused_as_invalid(error_message):
        return (
            f"{error_message} (Kubernetes refuses the workspace's resources as invalid and no retry changes "
            "that: terminate this workspace and create a new one with a corrected devfile)"
        )
    return (
        f"{error_message} (agentk applies the workspace again at every partial reconciliation: it returns to its "
        "desired state once the cause is fixed)"
    )


def desired_after_report(desired: str, reported_actual: str) -> str:
    """The RestartRequested -> Running flip when agentk reports Stopped (seed 003; reference §3.3)."""
    if desired == State.RESTART_REQUESTED and reported_actual == State.STOPPED:
        return State.RUNNING
    return desired


def lifecycle_desired(
    desired: str,
    created_at: datetime,
    desired_state_updated_at: datetime,
    now: datetime,
    max_active_hours_before_stop: int,
    max_stopped_hours_before_termination: int,
) -> str:
    """The desired state after the lifecycle rules (reference §2 step 7; vectors §V5); first match wins.

    1. older than :data:`MAX_HOURS_BEFORE_TERMINATION` hours (strictly) -> Terminated;
    2. not Stopped and desired unchanged for more than ``max_active_hours_before_stop`` -> Stopped;
    3. Stopped and unchanged for strictly more than ``max_stopped_hours_before_termination`` -> Terminated.

    A workspace already desired Terminated is left alone.
    """
    if desired == State.TERMINATED:
        return desired
    if created_at + timedelta(hours=MAX_HOURS_BEFORE_TERMINATION) < now:
        return State.TERMINATED
    if desired != State.STOPPED and desired_state_updated_at + timedelta(hours=max_active_hours_before_stop) < now:
        return State.STOPPED
    if desired == State.STOPPED and (now - desired_state_updated_at) > timedelta(
        hours=max_stopped_hours_before_termination
    ):
        return State.TERMINATED
    return desired


def replicas_for(desired: str) -> int:
    """Deployment replicas for a desired state: 1 only for Running (reference §3.3)."""
    return 1 if desired == State.RUNNING else 0
