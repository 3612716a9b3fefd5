"""Which proxied requests are recorded (issue 25 item 2).

Interactive exec/attach sessions of agents whose configuration has ``audit: {record_sessions: true}``.
"""

from __future__ import annotations

import re
import uuid

from tether.modserver.gitlab_client import ProxyUserAuthorization
from tether.modules import audit
from tether.modules.kubernetes_api.server.config import KubernetesApiCF

__all__ = ["session_recorder"]

#: The pod subresources that carry a terminal session (core API group, any namespace and pod).
_SESSION_PATH = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/(exec|attach)/?$")


def session_recorder(
    config: KubernetesApiCF,
    auth: ProxyUserAuthorization,
    url_path: str,
    upgrade: bool,
    event_id: str = "",
    budget: audit.RecordingBudget | None = None,
) -> audit.SessionRecorder | None:
    """A recorder for this request, or None when it is not a recorded session.

    Args:
        config: the ``agent.kubernetes_api`` section (the recording's size cap).
        auth: the hub's answer for the request's credentials (``record_sessions``).
        url_path: the request path with kas' prefix removed.
        upgrade: whether the request asks for an upgrade (only upgraded exec/attach are sessions).
        event_id: the request's audit event id; a new one when empty.
        budget: the bytes all recordings of this kas share (``session_recording_max_total_bytes``), or None.
    """
    if not (upgrade and auth.record_sessions and _SESSION_PATH.match(url_path)):
        return None
    return audit.SessionRecorder(  # imported here, with the first recorded session
        event_id or uuid.uuid4().hex, auth.agent_id, auth.user_id, config.session_recording_max_bytes, budget
    )
