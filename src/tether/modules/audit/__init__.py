"""The audit feature module (issue 25 item 1): an event for every request kas relays to an agent.

kas makes the events and ships them to the hub in batches (``server/``: the sink behind ``ServerApi.audit``, the
bounded queue, the local spool and the batch shipper); the hub stores and serves them (``hub/``); both halves
share :mod:`tether.modules.audit.protocol`, the contract of the three audit branches.
"""

from typing import TYPE_CHECKING

#: The module name (the kas configuration section).
MODULE_NAME = "audit"

# The recording API other modules use (issue 25 item 2: the Kubernetes API proxy records exec/attach sessions).
# Imported on first use: the hub and kas import this package for the protocol alone.
if TYPE_CHECKING:
    from tether.modules.audit.recording.budget import RecordingBudget
    from tether.modules.audit.recording.recorder import SessionRecorder
    from tether.modules.audit.recording.store import store_after_session

__all__ = ["MODULE_NAME", "RecordingBudget", "SessionRecorder", "store_after_session"]


def __getattr__(name: str) -> object:
    """The recording API (:class:`RecordingBudget`, :class:`SessionRecorder`, :func:`store_after_session`), on use.

    Raises:
        AttributeError: any other name.
    """
    if name == "RecordingBudget":
        from tether.modules.audit.recording.budget import RecordingBudget  # noqa: PLC0415

        return RecordingBudget
    if name == "SessionRecorder":
        from tether.modules.audit.recording.recorder import SessionRecorder  # noqa: PLC0415

        return SessionRecorder
    if name == "store_after_session":
        from tether.modules.audit.recording.store import store_after_session  # noqa: PLC0415

        return store_after_session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
