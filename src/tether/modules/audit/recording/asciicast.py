"""An asciicast v2 file built from a terminal session's streams (format: asciinema's asciicast v2 spec).

The file is a header line (JSON: ``version`` 2, ``width``, ``height``, ``timestamp`` in unix seconds) followed
by one JSON array per event: ``[seconds since the start, "o" | "i" | "r", data]``: ``o`` output (the container's
stdout and stderr), ``i`` input (the user's stdin), ``r`` a terminal resize (``"WIDTHxHEIGHT"``). Bytes are
decoded as UTF-8 per stream, incrementally (a character split across two frames stays whole); invalid bytes
become U+FFFD.
"""

from __future__ import annotations

import codecs
import json
from typing import Literal

__all__ = ["DEFAULT_HEIGHT", "DEFAULT_WIDTH", "Asciicast", "EventCode"]

#: Terminal size of the header when the session never sent one (kubectl without ``-t``).
DEFAULT_WIDTH = 80
DEFAULT_HEIGHT = 24
#: ``o`` output, ``i`` input, ``r`` resize.
EventCode = Literal["o", "i", "r"]


class Asciicast:
    """Collects a session's events; :meth:`encode` writes the file.

    Args:
        timestamp: unix seconds of the session's start (the header's ``timestamp``).
        env: the header's ``env`` (e.g. ``{"TERM": "xterm"}``), omitted when empty.
    """

    def __init__(self, timestamp: float, env: dict[str, str] | None = None) -> None:
        self._timestamp = timestamp
        self._env = env or {}
        self._size: tuple[int, int] | None = None
        self._events: list[tuple[float, EventCode, str]] = []
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def data(self, seconds: float, code: Literal["o", "i"], stream: str, data: bytes) -> None:
        """Record ``data`` of ``stream`` (e.g. ``stdout``) at ``seconds`` after the start as an ``o``/``i`` event."""
        decoder = self._decoders.get(stream)
        if decoder is None:
            decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(data)
        if text:
            self._events.append((seconds, code, text))

    def resize(self, seconds: float, width: int, height: int) -> None:
        """Record a terminal resize; the first one (or the default 80x24) sizes the header."""
        if width <= 0 or height <= 0:
            return
        if self._size is None:
            self._size = (width, height)
        self._events.append((seconds, "r", f"{width}x{height}"))

    @property
    def events(self) -> list[tuple[float, EventCode, str]]:
        """The events so far, in order: (seconds since the start, code, data)."""
        return self._events

    def encode(self) -> bytes:
        """The asciicast v2 file (UTF-8 JSON lines), events in time order."""
        width, height = self._size or (DEFAULT_WIDTH, DEFAULT_HEIGHT)
        header: dict[str, object] = {"version": 2, "width": width, "height": height, "timestamp": int(self._timestamp)}
        if self._env:
            header["env"] = self._env
        lines = [json.dumps(header)]
        lines += [json.dumps([round(max(t, 0.0), 6), code, text], ensure_ascii=False) for t, code, text in self._events]
        return ("\n".join(lines) + "\n").encode()
