"""Sending a finished session's recording to the hub, with a deadline: a slow hub costs the recording only."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from tether.modserver.gitlab_client import GitlabClient, GitlabClientError
from tether.modules.audit.protocol import RECORDING_COMPLETE, RECORDING_INCOMPLETE
from tether.modules.audit.recording.recorder import SessionRecorder

__all__ = ["DEFAULT_STORE_TIMEOUT_S", "store_after_session", "store_recording"]

log = logging.getLogger(__name__)

#: Default longest wait for the hub to take one recording.
DEFAULT_STORE_TIMEOUT_S = 10.0


async def store_recording(gitlab: GitlabClient, recorder: SessionRecorder, timeout_s: float) -> str:
    """Encode the session's recording (in a thread) and ``PUT`` it to the hub within ``timeout_s`` seconds.

    Called once the session's connection is closed, so neither the encoding nor the hub holds up its bytes. The
    recording's bytes go back to its budget at the end, whatever the outcome.

    Returns:
        the audit event's ``recording`` value: "" (no session took place: the cluster refused the upgrade),
        "complete", or "incomplete" (bytes were left out, or the hub did not take the file in time: then the
        hub has none, or an older copy).
    """
    try:
        if not recorder.switched:
            return ""
        cast = await asyncio.to_thread(recorder.encode, recorder.reserve_file())
        recorder.hold_encoded(len(cast))
        try:
            await asyncio.wait_for(
                gitlab.put_audit_recording(
                    recorder.event_id, cast, recorder.complete, recorder.agent_id, recorder.user_id
                ),
                timeout_s,
            )
        except (GitlabClientError, TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("session recording %s not stored by the hub: %r", recorder.event_id, exc)
            return RECORDING_INCOMPLETE
        return RECORDING_COMPLETE if recorder.complete else RECORDING_INCOMPLETE
    finally:
        recorder.release()  # its bytes go back to the process' budget


async def store_after_session(gitlab: GitlabClient, recorder: SessionRecorder, timeout_s: float) -> str:
    """:func:`store_recording` from a request handler whose client connection just closed.

    aiohttp cancels such a handler (``handler_cancellation``) as soon as it notices the closed connection, which
    for an upgraded session is right after its end: the store would be cancelled with it. So the store runs as
    its own task and this waits for it (at most ``timeout_s`` plus the encoding) even through a cancellation,
    which is then requested again once the answer is known, so that the caller can still put the answer in the
    session's audit event before it unwinds.
    """
    task = asyncio.ensure_future(store_recording(gitlab, recorder, timeout_s))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled and (current := asyncio.current_task()) is not None:
        current.cancel()
    return task.result()
