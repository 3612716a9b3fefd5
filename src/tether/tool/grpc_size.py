"""The received-message size limit of kas' gRPC listeners: gRPC Core refuses an oversize message on its prefix.

Why Core and not Python (issue 27 item 1): grpcio's HTTP/2 transport (``frame_data.cc``, grpcio 1.85.1) compares
a message's 5-byte length prefix with ``grpc.max_receive_message_length`` before it reads the message, and ends
the call with ``RESOURCE_EXHAUSTED`` ``SERVER: Received message larger than max (N vs. L)``; the sender's
bytes beyond the HTTP/2 stream window (1 MiB, ``BOUNDED_WINDOW_OPTIONS``) are never accepted. With the limit
at -1 and the size checked in Python once a message had arrived (issue 9's ``tool/grpc_size`` interceptor),
Core first buffered the whole message and Python received a copy: one 1 GiB ``GetConfiguration`` with a valid
agent token took kas to 3.2 GiB, a 48 MiB one +144 MiB (``tests/e2e/test_kas_bad_input.py``).

The price: the same channel argument adds Core's message-size filter to every call of the listener, about
1.5 KiB per open call (``bench/grpc_floor.py``: 77.1 against 72.6 KiB per connection holding three streams);
the Python check it replaces cost about 0.35 KiB per call itself. No grpcio argument enables the transport's
check without the filter (both read ``grpc.max_receive_message_length``; ``grpc.minimal_stack`` drops both).

No send limit: every message kas sends is built by kas or relayed from a peer whose message passed this limit.
"""

from __future__ import annotations

__all__ = ["receive_limit_options"]


def receive_limit_options(limit: int) -> list[tuple[str, int]]:
    """Server (or channel) arguments that make Core refuse received messages over ``limit`` bytes.

    Args:
        limit: the listener's ``max_message_size`` in bytes (serialized message, without the 5-byte prefix).

    Raises:
        ValueError: ``limit`` is negative (Core would read it as "no limit").
    """
    if limit < 0:
        raise ValueError(f"a message size limit must be >= 0 bytes, not {limit}")
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)]
