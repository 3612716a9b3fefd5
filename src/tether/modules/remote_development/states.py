"""Workspace states (seed 003 "Workspace states"; reference §3.1).

The seed lists eleven states. ``RestartRequested`` is valid only as a desired state; the other ten are the
actual states. The desired states are the subset ``Running``, ``Stopped``, ``Terminated`` plus
``RestartRequested``.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Every workspace state name, as stored and sent on the wire."""

    CREATION_REQUESTED = "CreationRequested"
    STARTING = "Starting"
    RUNNING = "Running"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    FAILED = "Failed"
    ERROR = "Error"
    RESTART_REQUESTED = "RestartRequested"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    UNKNOWN = "Unknown"


DESIRED_STATES = frozenset({State.RUNNING, State.RESTART_REQUESTED, State.STOPPED, State.TERMINATED})
ACTUAL_STATES = frozenset(State) - {State.RESTART_REQUESTED}
#: Column width in the database for both state columns (reference §3.1).
STATE_MAX_LENGTH = 32


def parse_desired(value: str) -> State:
    """Return the desired state named ``value``.

    Raises:
        ValueError: not one of Running, RestartRequested, Stopped, Terminated (the message lists them).
    """
    if value not in {s.value for s in DESIRED_STATES}:
        allowed = ", ".join(sorted(s.value for s in DESIRED_STATES))
        raise ValueError(f"desired state {value!r} is not one of: {allowed}")
    return State(value)
