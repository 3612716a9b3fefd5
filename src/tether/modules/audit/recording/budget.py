"""The bytes all recorded sessions of one kas hold at once (docs/limits.md, "Authenticated client").

Each recording keeps at most ``session_recording_max_bytes`` of its session, but a user allowed to exec into an
agent's pods can hold many sessions open, and kas would buffer that much for each: memory an authenticated user
decides. The budget bounds the sum. A recording that would go beyond it stops keeping bytes and is marked
incomplete, as at its own cap; the session's bytes flow on untouched. What a recording holds goes back when the
hub has its file, or when it was given up.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["RecordingBudget"]


class RecordingBudget:
    """Bytes shared by every session recording of one kas process; used from its event loop only.

    Args:
        max_bytes: most bytes held at once (``agent.kubernetes_api.session_recording_max_total_bytes``).
        registry: where ``tether_kas_session_recording_bytes`` (held now) and
            ``tether_kas_session_recordings_cut_total`` (recordings the budget stopped) are registered; None for
            none.
    """

    def __init__(self, max_bytes: int, registry: CollectorRegistry | None = None) -> None:
        self.max_bytes = max_bytes
        #: Bytes held now.
        self.used = 0
        self._cut: Counter | None = None
        if registry is not None:
            self._cut = Counter(
                "tether_kas_session_recordings_cut_total",
                "Session recordings marked incomplete because all recordings together held the most bytes allowed",
                registry=registry,
            )
            Gauge(
                "tether_kas_session_recording_bytes",
                "Bytes held by session recordings: kept bytes of running sessions, files not yet stored",
                registry=registry,
            ).set_function(lambda: self.used)

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes if the budget has room; False (counted as a cut recording) when it has not."""
        if self.used + size > self.max_bytes:
            if self._cut is not None:
                self._cut.inc()
            return False
        self.used += size
        return True

    def take_up_to(self, size: int) -> int:
        """Hold as much of ``size`` bytes as the budget has room for; return how many (0 when full)."""
        granted = max(0, min(size, self.max_bytes - self.used))
        self.used += granted
        return granted

    def hold(self, size: int) -> None:
        """Count ``size`` bytes that are in memory already (a recording's encoded file), even beyond the budget."""
        self.used += size

    def give_back(self, size: int) -> None:
        """Bytes taken or held before are free again."""
        self.used -= size
