"""The tap on one relayed exec/attach connection: raw bytes into a bounded buffer, an asciicast at the end.

The relay calls :meth:`SessionRecorder.client` / :meth:`SessionRecorder.server` with each chunk it forwards: an
append to a queue, no parsing, no I/O, no await, so recording costs the session next to nothing. Once
``max_bytes`` are buffered the recorder stops keeping bytes and the recording is incomplete (what came before is
kept); the session's bytes go on untouched. The same happens when all recordings of the process together hold
their :class:`~tether.modules.audit.recording.budget.RecordingBudget`. When the session is over,
:meth:`SessionRecorder.encode` parses the buffer (``websocket.py`` or ``spdy.py``, chosen by the ``101`` answer's
``Upgrade``) into an asciicast v2 file.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping, Sequence

from tether.modules.audit.recording.asciicast import Asciicast
from tether.modules.audit.recording.budget import RecordingBudget
from tether.modules.audit.recording.channels import ChannelSink
from tether.modules.audit.recording.spdy import SpdyDemux, SpdyError
from tether.modules.audit.recording.websocket import WebSocketDemux

__all__ = ["DEFAULT_MAX_BYTES", "SessionRecorder"]

log = logging.getLogger(__name__)

#: Default most bytes (both directions, protocol framing included) kept for one session.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
#: The file may be this many times the bytes kept, plus :data:`_FILE_SLACK`, and at most twice ``max_bytes`` (the
#: hub's own default cap, 16 MiB, is twice the default here). A keystroke and its echo make about 4 times their
#: bytes in JSON lines; a client sending one byte per frame makes far more, and its recording is cut there.
_FILE_PER_KEPT_BYTE = 8
_FILE_SLACK = 4096
_CLIENT, _SERVER = True, False


class SessionRecorder:
    """Records one exec/attach session relayed by kas.

    Args:
        event_id: the session's audit event id (the hub stores the recording under it).
        agent_id: the agent the session went to.
        user_id: the user who opened it (0: none).
        max_bytes: most raw bytes kept; beyond them the recording is incomplete.
        budget: the process' budget every kept byte is taken from (beyond it the recording is incomplete too), or
            None for none. :meth:`release` gives them back.
    """

    def __init__(
        self,
        event_id: str,
        agent_id: int,
        user_id: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
        budget: RecordingBudget | None = None,
    ) -> None:
        self.event_id = event_id
        self.agent_id = agent_id
        self.user_id = user_id
        self._max_bytes = max_bytes
        self._budget = budget
        #: Bytes this recording holds in the budget: the kept bytes, then the encoded file.
        self._held = 0
        self._started_unix = time.time()
        self._started = time.monotonic()
        self._chunks: collections.deque[tuple[float, bool, bytes]] = collections.deque()
        self._size = 0
        self._protocol = ""
        self._subprotocol = ""
        #: False once bytes were left out (buffer full) or could not be parsed.
        self.complete = True

    @property
    def switched(self) -> bool:
        """Whether the cluster switched protocols (a session took place)."""
        return bool(self._protocol)

    def upgraded(self, headers: Mapping[str, Sequence[str]]) -> None:
        """The ``101`` answer's headers: which protocol the session speaks."""
        values = {name.lower(): list(value) for name, value in headers.items()}
        upgrade = (values.get("upgrade") or [""])[0].lower()
        self._protocol = "spdy" if upgrade.startswith("spdy/") else "websocket"
        self._subprotocol = (values.get("sec-websocket-protocol") or [""])[0]

    def client(self, data: bytes) -> None:
        """Bytes the client sent (relayed to the cluster)."""
        self._keep(_CLIENT, data)

    def server(self, data: bytes) -> None:
        """Bytes the cluster sent (relayed to the client)."""
        self._keep(_SERVER, data)

    def _keep(self, direction: bool, data: bytes) -> None:
        if not self.complete:
            return
        size = len(data)
        if self._size + size > self._max_bytes or (self._budget is not None and not self._budget.take(size)):
            self.complete = False
            return
        if self._budget is not None:
            self._held += size
        self._size += size
        self._chunks.append((time.monotonic() - self._started, direction, data))

    def reserve_file(self) -> int:
        """The most bytes of events the file may have (:meth:`encode`); called on the event loop before it.

        The file may always use what the kept bytes hold in the budget (they are dropped as the file is made), and
        more while the budget has room, which is taken now. The kept bytes still there and the file so far exist
        together while it is made: for that moment the process may hold up to twice its share of the budget.
        """
        wanted = min(2 * self._max_bytes, self._size * _FILE_PER_KEPT_BYTE + _FILE_SLACK)
        if self._budget is None:
            return wanted
        self._held += self._budget.take_up_to(max(wanted - self._held, 0))
        return self._held

    def encode(self, max_file_bytes: int | None = None) -> bytes:
        """The asciicast v2 file of what was kept, made in a worker thread.

        A protocol error ends it there, and so does reaching ``max_file_bytes`` of events (:meth:`reserve_file`);
        either marks the recording incomplete.
        """
        cast = Asciicast(self._started_unix, {"TERM": "xterm-256color"}, max_file_bytes)
        sink = ChannelSink(cast)
        demux = SpdyDemux(sink) if self._protocol == "spdy" else WebSocketDemux(sink, self._subprotocol)
        try:
            while self._chunks:
                seconds, direction, data = self._chunks.popleft()  # each chunk goes as soon as it is in the file
                if direction is _CLIENT:
                    demux.client(seconds, data)
                else:
                    demux.server(seconds, data)
        except (SpdyError, ValueError) as exc:
            log.info("session recording %s stops at a protocol error: %s", self.event_id, exc)
            self.complete = False
        self._chunks.clear()
        if not cast.complete:
            log.info("session recording %s stops at its file's %d bytes", self.event_id, max_file_bytes)
            self.complete = False
        return cast.encode()

    def hold_encoded(self, size: int) -> None:
        """The encoded file (``size`` bytes) replaces the kept bytes and the reservation in the budget.

        It stays counted until :meth:`release`. Called on the event loop once :meth:`encode` (in a worker thread)
        has returned.
        """
        if self._budget is not None:
            self._budget.give_back(self._held)
            self._budget.hold(size)
            self._held = size

    def release(self) -> None:
        """Drop what was kept and give it back to the budget: the recording is stored or given up."""
        self._chunks.clear()
        if self._budget is not None:
            self._budget.give_back(self._held)
        self._held = 0
