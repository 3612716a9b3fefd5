"""Jittered exponential backoff, as upstream's retry loops use it (kas.md §1.4, §2.5, §6.3)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field


@dataclass(slots=True)  # one per agent configuration stream, for hours
class Backoff:
    """Delay generator: ``initial_s * factor**n`` capped at ``max_s``, with proportional jitter.

    After ``reset_after_s`` seconds without a failure the next delay starts from ``initial_s`` again.

    Attributes:
        initial_s: first delay in seconds.
        max_s: largest delay in seconds (before jitter).
        factor: growth per consecutive failure.
        jitter: fraction of the delay added at random (0.2 adds 0-20 %).
        reset_after_s: quiet period that resets the sequence; 0 never resets.
    """

    initial_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 1.0
    reset_after_s: float = 0.0
    _current: float = field(default=0.0, init=False)
    _last: float = field(default=0.0, init=False)

    def next_delay(self) -> float:
        """Return the seconds to wait before the next attempt and advance the sequence."""
        now = time.monotonic()
        if self._current == 0.0 or (self.reset_after_s and now - self._last > self.reset_after_s):
            self._current = self.initial_s
        else:
            self._current = min(self._current * self.factor, self.max_s)
        self._last = now
        return self._current * (1.0 + random.uniform(0.0, self.jitter))

    def reset(self) -> None:
        """Start over from ``initial_s`` (call after a success)."""
        self._current = 0.0


#: Reconnect backoff of a gRPC channel to kas (agentk -> kas, kas -> kas), in milliseconds. gRPC's own default
#: grows to 120 s, so a kas that was down for a minute stayed unreachable long after it came back; bounded, a
#: peer is reached again within about 2 s of being ready (issue 9 item 7).
CHANNEL_RECONNECT_BACKOFF_MS = (250, 2_000)


def channel_reconnect_options() -> list[tuple[str, int]]:
    """GRPC channel arguments bounding the reconnect backoff to :data:`CHANNEL_RECONNECT_BACKOFF_MS`."""
    low, high = CHANNEL_RECONNECT_BACKOFF_MS
    return [
        ("grpc.initial_reconnect_backoff_ms", low),
        ("grpc.min_reconnect_backoff_ms", low),
        ("grpc.max_reconnect_backoff_ms", high),
    ]
