"""A TCP relay in front of a real server that a test can cut: refuse every connection, or stop answering.

``TcpRelay(host, port)`` listens on a free loopback port and relays byte for byte (TLS passes through untouched,
so a client keeps verifying the server's certificate). :meth:`TcpRelay.refuse` closes every relayed connection
and each new one at once (the server went away); :meth:`TcpRelay.stall` keeps every connection open but relays
nothing more, and accepts new ones without ever reaching the server (a network partition, a frozen server).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["TcpRelay"]


class TcpRelay:
    """Relays loopback connections to ``host:port`` until told to refuse or to stall them."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._mode = "relay"
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpRelay:
        """Listen; returns self."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        """The port clients connect to."""
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    def refuse(self) -> None:
        """Close every connection now and each new one as it comes."""
        self._mode = "refuse"
        for writer in list(self._writers):
            writer.transport.abort()

    def stall(self) -> None:
        """Relay nothing more in either direction and never reach the server again; keep connections open."""
        self._mode = "stall"

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self._mode == "stall":
                await asyncio.Event().wait()  # until close() cancels it
            if self._mode == "relay":
                upstream_reader, upstream = await asyncio.open_connection(*self._target)
                self._writers.add(upstream)
                await asyncio.gather(self._pump(reader, upstream), self._pump(upstream_reader, writer))
        except OSError:
            pass
        finally:
            for side in (writer, upstream):
                if side is not None:
                    side.transport.abort()
                    self._writers.discard(side)
            self._tasks.discard(task)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if self._mode == "stall":
                    await asyncio.Event().wait()  # hold the bytes until close() cancels it
                sink.write(data)
                await sink.drain()
        sink.transport.abort()
