"""Demultiplexes a ``channel.k8s.io`` WebSocket session (kubectl's default since 1.30, ``v5.channel.k8s.io``).

Each direction is parsed by the ``websockets`` library's sans-I/O protocol (client frames are masked, the
server's are not; fragments are reassembled here). A binary message's first byte is the channel
(``channels.STREAM_NAMES``), the rest its data. The ``base64.channel.k8s.io`` variants send text messages whose
first character is the channel digit and whose rest is base64 (k8s.io/apimachinery ``wsstream``).
"""

from __future__ import annotations

import base64
import binascii

from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from tether.modules.audit.recording.channels import STREAM_NAMES, ChannelSink

__all__ = ["WebSocketDemux"]


class _Direction:
    def __init__(self, parser_side: Side, base64_text: bool) -> None:
        self._protocol = Protocol(parser_side, state=State.OPEN, max_size=None)
        self._base64 = base64_text
        self._message = bytearray()
        self._text = False
        self.closed = False

    def feed(self, data: bytes) -> list[bytes]:
        if self.closed:
            return []
        self._protocol.receive_data(data)
        self._protocol.data_to_send()  # pongs and close replies: the real peer sends its own
        messages = []
        for frame in self._protocol.events_received():
            if not isinstance(frame, Frame):  # only handshakes give Request/Response; this protocol starts OPEN
                continue
            message = self._frame(frame)
            if message is not None:
                messages.append(message)
        if self._protocol.state is not State.OPEN:
            self.closed = True
        return messages

    def _frame(self, frame: Frame) -> bytes | None:
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            self._message = bytearray(frame.data)
            self._text = frame.opcode is Opcode.TEXT
        elif frame.opcode is Opcode.CONT:
            self._message += frame.data
        else:
            return None
        if not frame.fin:
            return None
        message, self._message = bytes(self._message), bytearray()
        if self._text and self._base64 and message:
            try:
                return bytes([message[0] - ord("0")]) + base64.b64decode(message[1:])
            except (binascii.Error, ValueError):
                return None
        return message


class WebSocketDemux:
    """Feeds both directions of an upgraded WebSocket exec/attach connection into a :class:`ChannelSink`.

    Args:
        sink: where stream bytes go.
        subprotocol: the negotiated ``Sec-WebSocket-Protocol`` (e.g. ``v5.channel.k8s.io``).
    """

    def __init__(self, sink: ChannelSink, subprotocol: str) -> None:
        self._sink = sink
        base64_text = subprotocol.startswith("base64.")
        self._client = _Direction(Side.SERVER, base64_text)  # parses what the client sends, as a server does
        self._server = _Direction(Side.CLIENT, base64_text)

    def client(self, seconds: float, data: bytes) -> None:
        """Bytes the client sent, ``seconds`` after the start."""
        self._deliver(seconds, self._client.feed(data))

    def server(self, seconds: float, data: bytes) -> None:
        """Bytes the cluster sent."""
        self._deliver(seconds, self._server.feed(data))

    def _deliver(self, seconds: float, messages: list[bytes]) -> None:
        for message in messages:
            if not message:
                continue
            name = STREAM_NAMES.get(message[0])
            if name is not None:
                self._sink.stream(seconds, name, message[1:])
