"""Demultiplexes a SPDY/3.1 exec/attach session (kubectl's fallback, and clients older than 1.30).

kubectl speaks it with ``KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`` or when the server refuses WebSockets.

No maintained SPDY library exists for Python, so this reads only what a recording needs (SPDY protocol draft 3.1,
section 2.2): frames are an 8-byte head then a payload of the head's 24-bit length. A control frame's head has
the high bit set, the version (15 bits), the type (16 bits); a data frame's has the 31-bit stream id. Of the
control frames only ``SYN_STREAM`` (type 1) matters: the client opens one stream per channel and names it in a
``streamType`` header (stdin, stdout, stderr, error, resize). Header blocks are zlib-compressed with one context
per direction primed with the SPDY dictionary; every header block is decompressed (even unused ones) so that the
context stays in step. Data frames of a stream carry its bytes as they are.
"""

from __future__ import annotations

import zlib

from tether.modules.audit.recording.channels import ChannelSink
from tether.modules.audit.recording.spdy_dictionary import SPDY3_DICTIONARY

__all__ = ["SpdyDemux", "SpdyError"]

_HEAD = 8
_SYN_STREAM = 1
_SYN_REPLY = 2
_HEADERS = 8
#: Control frames whose payload holds a compressed header block, and where that block starts.
_HEADER_BLOCK_AT = {_SYN_STREAM: 10, _SYN_REPLY: 4, _HEADERS: 4}
#: Largest decompressed header block read (kubectl's are a few hundred bytes).
_MAX_HEADERS = 64 * 1024


class SpdyError(ValueError):
    """The bytes are not SPDY/3 as expected; the recording stops there."""


class _Direction:
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflate = zlib.decompressobj(zdict=SPDY3_DICTIONARY)

    def frames(self, data: bytes) -> list[tuple[bool, int, bytes]]:
        """Complete frames so far: (control?, type or stream id, payload)."""
        self._buffer += data
        out = []
        while len(self._buffer) >= _HEAD:
            length = int.from_bytes(self._buffer[5:8], "big")
            if len(self._buffer) < _HEAD + length:
                break
            head = int.from_bytes(self._buffer[0:4], "big")
            payload = bytes(self._buffer[_HEAD : _HEAD + length])
            del self._buffer[: _HEAD + length]
            if head & 0x80000000:
                if (head >> 16) & 0x7FFF != 3:
                    raise SpdyError(f"SPDY version {(head >> 16) & 0x7FFF}, expected 3")
                out.append((True, head & 0xFFFF, payload))
            else:
                out.append((False, head & 0x7FFFFFFF, payload))
        return out

    def headers(self, block: bytes) -> dict[str, str]:
        try:
            raw = self._inflate.decompress(block, _MAX_HEADERS)
        except zlib.error as exc:
            raise SpdyError(f"header block does not decompress: {exc}") from exc
        headers: dict[str, str] = {}
        try:
            count, position = int.from_bytes(raw[0:4], "big"), 4
            for _ in range(count):
                size = int.from_bytes(raw[position : position + 4], "big")
                name = raw[position + 4 : position + 4 + size].decode("latin-1").lower()
                position += 4 + size
                size = int.from_bytes(raw[position : position + 4], "big")
                headers[name] = raw[position + 4 : position + 4 + size].decode("latin-1")
                position += 4 + size
        except (IndexError, ValueError) as exc:
            raise SpdyError(f"malformed header block: {exc}") from exc
        return headers


class SpdyDemux:
    """Feeds both directions of an upgraded SPDY/3.1 exec/attach connection into a :class:`ChannelSink`.

    Raises:
        SpdyError: from :meth:`client` / :meth:`server` when the bytes are not SPDY/3 (the caller stops
            recording; the session itself is not touched).
    """

    def __init__(self, sink: ChannelSink) -> None:
        self._sink = sink
        self._client = _Direction()
        self._server = _Direction()
        #: stream id -> ``streamType`` (both sides' streams share the id space: kubectl opens them all).
        self._streams: dict[int, str] = {}

    def client(self, seconds: float, data: bytes) -> None:
        """Bytes the client sent, ``seconds`` after the start."""
        self._feed(self._client, seconds, data)

    def server(self, seconds: float, data: bytes) -> None:
        """Bytes the cluster sent."""
        self._feed(self._server, seconds, data)

    def _feed(self, direction: _Direction, seconds: float, data: bytes) -> None:
        for control, kind, payload in direction.frames(data):
            if not control:
                name = self._streams.get(kind)
                if name is not None and payload:
                    self._sink.stream(seconds, name, payload)
                continue
            start = _HEADER_BLOCK_AT.get(kind)
            if start is None:
                continue
            headers = direction.headers(payload[start:])
            if kind == _SYN_STREAM:
                stream_id = int.from_bytes(payload[0:4], "big") & 0x7FFFFFFF
                stream_type = headers.get("streamtype")
                if stream_type:
                    self._streams[stream_id] = stream_type
