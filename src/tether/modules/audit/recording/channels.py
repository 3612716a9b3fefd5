"""The streams of the Kubernetes remote command protocols and where each goes in a recording.

Stream ids of the WebSocket ``channel.k8s.io`` protocols (k8s.io/apimachinery ``remotecommand`` constants):
0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize, 255 close (v5 only). SPDY names the same streams in a
``streamType`` header instead. A resize carries JSON ``{"Width": w, "Height": h}``.
"""

from __future__ import annotations

import json
import logging

from tether.modules.audit.recording.asciicast import Asciicast

__all__ = ["STREAM_NAMES", "ChannelSink"]

log = logging.getLogger(__name__)

#: WebSocket channel id -> stream name (the SPDY ``streamType`` values).
STREAM_NAMES = {0: "stdin", 1: "stdout", 2: "stderr", 3: "error", 4: "resize"}


class ChannelSink:
    """Routes demultiplexed stream bytes into an :class:`Asciicast`.

    stdin becomes input, stdout/stderr output, resize ``r``; the error stream (the exec's final ``Status``) and
    unknown streams are left out.
    """

    def __init__(self, cast: Asciicast) -> None:
        self.cast = cast
        self._resize = bytearray()

    def stream(self, seconds: float, name: str, data: bytes) -> None:
        """``data`` arrived on stream ``name`` at ``seconds`` after the session start."""
        if name == "stdin":
            self.cast.data(seconds, "i", name, data)
        elif name in ("stdout", "stderr"):
            self.cast.data(seconds, "o", name, data)
        elif name == "resize":
            self._resize_data(seconds, data)

    def _resize_data(self, seconds: float, data: bytes) -> None:
        # kubectl writes one JSON object per resize; a WebSocket message holds exactly one, a SPDY stream may
        # split or join them, so objects are read off a buffer.
        self._resize += data
        decoder = json.JSONDecoder()
        text = self._resize.decode("utf-8", "replace")
        position = 0
        while True:
            stripped = len(text) - len(text[position:].lstrip())
            position = stripped
            if position >= len(text):
                break
            try:
                value, position = decoder.raw_decode(text, position)
            except ValueError:
                break
            if isinstance(value, dict):
                width, height = value.get("Width"), value.get("Height")
                if isinstance(width, int) and isinstance(height, int):
                    self.cast.resize(seconds, width, height)
        self._resize = bytearray(text[position:].encode())
