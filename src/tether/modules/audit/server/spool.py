"""The local spool of audit events: append-only JSON-lines segment files in one directory (issue 25 item 1).

Events the hub cannot take now (unreachable, or the in-memory queue is full) are appended to the newest segment
(``<sequence>.jsonl``, one event per line), written at once (a kas killed with SIGKILL keeps them: the bytes are
in the kernel) and flushed to disk (fsync) at most once per :data:`FSYNC_INTERVAL_S`. The shipper reads the
oldest segment, sends it in batches and deletes it only once the hub took all of it; a kas that dies in between
sends the segment again on its next start with the same event ids, and the hub stores each id once. A line torn
by a crash is skipped (logged). The spool never holds more than ``max_bytes``: appending beyond it refuses the
events (the caller counts and logs the drop).

Every method does file I/O: call them from a worker thread (``asyncio.to_thread``), one at a time.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

__all__ = ["FSYNC_INTERVAL_S", "SEGMENT_MAX_BYTES", "Spool"]

log = logging.getLogger(__name__)

#: A segment is closed for appends once it holds this many bytes (so the shipper can finish and delete it).
SEGMENT_MAX_BYTES = 4 * 1024 * 1024
#: Most seconds between a spooled event and its fsync (a machine crash may lose at most this much).
FSYNC_INTERVAL_S = 1.0
_SUFFIX = ".jsonl"


class Spool:
    """The segment files under ``directory`` (created if missing).

    Args:
        directory: the spool directory; one kas only.
        max_bytes: most bytes all segments may hold together.

    Raises:
        OSError: the directory cannot be created or listed.
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self._max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._segments = sorted(directory.glob(f"*{_SUFFIX}"), key=_sequence)
        self._size = sum(path.stat().st_size for path in self._segments)
        self._next = _sequence(self._segments[-1]) + 1 if self._segments else 1
        #: The segment being appended to, and its open descriptor (always the newest segment).
        self._open: tuple[Path, int] | None = None
        self._synced_at = 0.0

    @property
    def size(self) -> int:
        """Bytes held by all segments."""
        return self._size

    @property
    def empty(self) -> bool:
        """Whether no segment is waiting."""
        return not self._segments

    def append(self, lines: list[bytes]) -> int:
        """Append encoded events (each ending in a newline) to the newest segment; return how many fit.

        The first ``n`` lines fit under ``max_bytes`` and are written; the rest are refused.
        """
        room, taken = self._max_bytes - self._size, 0
        for line in lines:
            if len(line) > room:
                break
            room -= len(line)
            taken += 1
        if taken == 0:
            return 0
        fd = self._segment_fd()
        data = b"".join(lines[:taken])
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        self._size += len(data)
        now = time.monotonic()
        if now - self._synced_at >= FSYNC_INTERVAL_S:
            os.fsync(fd)
            self._synced_at = now
        if os.fstat(fd).st_size >= SEGMENT_MAX_BYTES:
            self._close()
        return taken

    def _segment_fd(self) -> int:
        if self._open is None:
            path = self.directory / f"{self._next:012d}{_SUFFIX}"
            self._next += 1
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._segments.append(path)
            self._open = (path, fd)
        return self._open[1]

    def _close(self) -> None:
        if self._open is not None:
            fd = self._open[1]
            self._open = None
            os.fsync(fd)
            os.close(fd)

    def oldest(self) -> tuple[Path, list[bytes]] | None:
        """The oldest segment and its complete lines (closing it for appends first), or None when empty."""
        if not self._segments:
            return None
        path = self._segments[0]
        if self._open is not None and self._open[0] == path:
            self._close()
        data = path.read_bytes()
        lines = data.split(b"\n")
        if lines[-1]:
            log.warning("audit spool %s ends with a torn line (%d bytes); it is skipped", path, len(lines[-1]))
        return path, [line + b"\n" for line in lines[:-1] if line]

    def remove(self, path: Path) -> None:
        """Delete a segment whose events the hub took."""
        size = path.stat().st_size
        path.unlink()
        self._segments.remove(path)
        self._size -= size

    def close(self) -> None:
        """Flush and close the segment being appended to."""
        self._close()


def _sequence(path: Path) -> int:
    try:
        return int(path.name.removesuffix(_SUFFIX))
    except ValueError:
        return 0
