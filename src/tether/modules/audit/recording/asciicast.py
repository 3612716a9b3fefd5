"""An asciicast v2 file built from a terminal session's streams (format: asciinema's asciicast v2 spec).

The file is a header line (JSON: ``version`` 2, ``width``, ``height``, ``timestamp`` in unix seconds) followed
by one JSON array per event: ``[seconds since the start, "o" | "i" | "r", data]``: ``o`` output (the container's
stdout and stderr), ``i`` input (the user's stdin), ``r`` a terminal resize (``"WIDTHxHEIGHT"``). Bytes are
decoded as UTF-8 per stream, incrementally (a character split across two frames stays whole); invalid bytes
become U+FFFD.

Each event is written as its line at once, into one buffer of at most ``max_bytes``: a session of many tiny frames
(a line of JSON each) would otherwise hold a Python object per event while the file is made.
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
    """Collects a session's events, in time order; :meth:`encode` writes the file.

    Args:
        timestamp: unix seconds of the session's start (the header's ``timestamp``).
        env: the header's ``env`` (e.g. ``{"TERM": "xterm"}``), omitted when empty.
        max_bytes: most bytes of event lines (the header aside); None for no bound. The first event that does not
            fit ends the file there and clears :attr:`complete`.
    """

    def __init__(self, timestamp: float, env: dict[str, str] | None = None, max_bytes: int | None = None) -> None:
        self._timestamp = timestamp
        self._env = env or {}
        self._size: tuple[int, int] | None = None
        self._lines = bytearray()
        self._max_bytes = max_bytes
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        #: False once an event was left out because the file reached ``max_bytes``.
        self.complete = True

    def data(self, seconds: float, code: Literal["o", "i"], stream: str, data: bytes) -> None:
        """Record ``data`` of ``stream`` (e.g. ``stdout``) at ``seconds`` after the start as an ``o``/``i`` event."""
        decoder = self._decoders.get(stream)
        if decoder is None:
            decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(data)
        if text:
            self._add(seconds, code, text)

    def resize(self, seconds: float, width: int, height: int) -> None:
        """Record a terminal resize; the first one (or the default 80x24) sizes the header."""
        if width <= 0 or height <= 0:
            return
        if self._size is None:
            self._size = (width, height)
        self._add(seconds, "r", f"{width}x{height}")

    def _add(self, seconds: float, code: EventCode, text: str) -> None:
        if not self.complete:
            return
        line = json.dumps([round(max(seconds, 0.0), 6), code, text], ensure_ascii=False).encode() + b"\n"
        if self._max_bytes is not None and len(self._lines) + len(line) > self._max_bytes:
            self.complete = False
            return
        self._lines += line

    def encode(self) -> bytes:
        """The asciicast v2 file (UTF-8 JSON lines): the header, then the events."""
        width, height = self._size or (DEFAULT_WIDTH, DEFAULT_HEIGHT)
        header: dict[str, object] = {"version": 2, "width": width, "height": height, "timestamp": int(self._timestamp)}
        if self._env:
            header["env"] = self._env
        return json.dumps(header).encode() + b"\n" + self._lines
