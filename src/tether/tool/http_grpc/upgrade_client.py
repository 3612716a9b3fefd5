"""agentk's HTTP/1.1 exchange for upgrade requests: keeps the raw connection after ``101`` (kas.md §5.4).

aiohttp's client only upgrades to WebSocket and would decode its frames; the proxy must relay the bytes
of any upgraded protocol (WebSocket, SPDY/3.1) untouched. So upgrade requests are written by hand on a
plain (or TLS, ALPN ``http/1.1``) connection, the response head is parsed here, and after a ``101`` the
connection's two directions are handed to the caller. A non-``101`` answer's body is read by its framing
(``Content-Length``, ``chunked`` or until the server closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import yarl

from tether.tool.ids import is_ascii_number

__all__ = ["HEAD_LIMIT", "UpgradeExchange", "UpgradeProtocolError", "open_exchange"]

#: Largest response head accepted, in bytes.
HEAD_LIMIT = 64 * 1024


class UpgradeProtocolError(Exception):
    """The server's answer is not valid HTTP/1.1."""


@dataclass
class UpgradeExchange:
    """An upgrade request that was sent, with the parsed response head.

    Attributes:
        status: response status code, e.g. 101.
        reason: reason phrase, e.g. ``Switching Protocols``.
        version: ``(major, minor)`` of the response, e.g. ``(1, 1)``.
        headers: response headers as (name, value) pairs in received order.
        reader: the connection's incoming side, positioned after the head.
        writer: the connection's outgoing side.
    """

    status: int
    reason: str
    version: tuple[int, int]
    headers: list[tuple[str, str]]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    async def body(self, chunk_size: int) -> AsyncIterator[bytes]:
        """Yield the body of a non-``101`` response in pieces of at most ``chunk_size`` bytes.

        Raises:
            UpgradeProtocolError: malformed chunked framing.
            asyncio.IncompleteReadError: the server closed before the declared end.
        """
        if self.status in (204, 304) or 100 <= self.status < 200:
            return
        if "chunked" in (self.header("Transfer-Encoding") or "").lower():
            async for piece in self._chunked(chunk_size):
                yield piece
            return
        length = self.header("Content-Length")
        if length is not None:
            if not is_ascii_number(length.strip()) or len(length.strip()) > 18:
                raise UpgradeProtocolError(f"invalid Content-Length {length!r}")
            left = int(length)
            while left > 0:
                piece = await self.reader.readexactly(min(left, chunk_size))
                left -= len(piece)
                yield piece
            return
        while piece := await self.reader.read(chunk_size):
            yield piece

    async def _chunked(self, chunk_size: int) -> AsyncIterator[bytes]:
        while True:
            line = await self.reader.readuntil(b"\r\n")
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise UpgradeProtocolError(f"invalid chunk size {size_text[:20]!r}") from None
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailer fields are dropped
                return
            while size > 0:
                piece = await self.reader.readexactly(min(size, chunk_size))
                size -= len(piece)
                yield piece
            if await self.reader.readexactly(2) != b"\r\n":
                raise UpgradeProtocolError("missing CRLF after a chunk")

    async def close(self) -> None:
        """Close the connection."""
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def _parse_head(head: bytes) -> tuple[int, str, tuple[int, int], list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    version_text, _, rest = lines[0].partition(" ")
    code_text, _, reason = rest.partition(" ")
    if not version_text.startswith("HTTP/") or not code_text.isdigit() or len(code_text) != 3:
        raise UpgradeProtocolError(f"invalid status line {lines[0][:100]!r}")
    major, _, minor = version_text.removeprefix("HTTP/").partition(".")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise UpgradeProtocolError(f"invalid header line {line[:100]!r}")
        headers.append((name, value.strip()))
    return int(code_text), reason, (int(major or 1), int(minor or 1)), headers


async def _send_body(writer: asyncio.StreamWriter, body: AsyncIterator[bytes], chunked: bool) -> None:
    async for piece in body:
        if chunked:
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
        else:
            writer.write(piece)
        await writer.drain()
    if chunked:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def open_exchange(
    url: yarl.URL,
    method: str,
    headers: list[tuple[str, str]],
    body: AsyncIterator[bytes] | None,
    content_length: int,
    ssl_context: ssl.SSLContext | None,
    connect_timeout_s: float,
) -> UpgradeExchange:
    """Connect, send the request and read the response head.

    Args:
        url: absolute URL (``http`` or ``https``) including the query.
        method: HTTP method, e.g. ``GET``.
        headers: request headers without framing headers for the body; ``Host`` is the URL's unless given.
        body: the request body, or None when ``content_length`` is 0.
        content_length: body size in bytes, 0 for none, -1 for unknown (sent chunked).
        ssl_context: TLS context for ``https`` (its ALPN should offer ``http/1.1`` only).
        connect_timeout_s: limit for TCP connect and TLS handshake, in seconds.

    Raises:
        OSError, TimeoutError, ssl.SSLError: the connection failed.
        UpgradeProtocolError: the response head is not valid HTTP/1.1.
        asyncio.IncompleteReadError, asyncio.LimitOverrunError: the head is cut short or too large.
    """
    if url.host is None or url.port is None:
        raise ValueError(f"URL {url} has no host")
    tls = ssl_context if url.scheme == "https" else None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            url.host, url.port, ssl=tls, server_hostname=url.host if tls else None, limit=HEAD_LIMIT
        ),
        connect_timeout_s,
    )
    try:
        lines = [f"{method} {url.raw_path_qs} HTTP/1.1"]
        if not any(name.lower() == "host" for name, _ in headers):
            lines.append(f"Host: {url.host_port_subcomponent}")
        lines += [f"{name}: {value}" for name, value in headers]
        if content_length < 0:
            lines.append("Transfer-Encoding: chunked")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if body is not None and content_length != 0:
            await _send_body(writer, body, chunked=content_length < 0)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status, reason, version, response_headers = _parse_head(head[:-4])
    except BaseException:
        writer.close()
        raise
    return UpgradeExchange(status, reason, version, response_headers, reader, writer)
