"""Conversions between gRPC metadata/status and their protobuf forms in tunnel and routing messages.

Metadata travels as ``map<string, prototool.Values>`` (kas.md §1.3 "Metadata maps"); a failed call's
status as ``google.rpc.Status`` (kas.md §1.7), whose ``details`` also ride in the standard
``grpc-status-details-bin`` trailer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeAlias

import grpc
from google.rpc import status_pb2

from tether.pb.gitlab.agent.prototool import prototool_pb2

#: Metadata as (key, value) pairs; ``-bin`` keys carry bytes. grpc.aio.Metadata is one too.
Metadata: TypeAlias = tuple[tuple[str, str | bytes], ...]
MetadataIn: TypeAlias = Iterable[tuple[str, str | bytes]]

STATUS_DETAILS_KEY = "grpc-status-details-bin"
#: Keys the transport manages itself; copying them onto another call would be wrong or rejected.
_RESERVED = frozenset({"content-type", "user-agent", "te", "grpc-encoding", "grpc-accept-encoding", "grpc-timeout"})


def _text(value: str | bytes) -> str:
    # Binary values are kept byte-for-byte through latin-1 (the map holds strings).
    return value.decode("latin-1") if isinstance(value, bytes) else value


def meta_to_values(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, prototool_pb2.Values]:
    """Group metadata pairs by key into ``{key: Values}``, dropping transport-reserved keys."""
    result: dict[str, prototool_pb2.Values] = {}
    for key, value in metadata or ():
        if key in _RESERVED or key.startswith(":"):
            continue
        result.setdefault(key, prototool_pb2.Values()).value.append(_text(value))
    return result


def values_to_meta(values: Mapping[str, prototool_pb2.Values]) -> Metadata:
    """Flatten a ``{key: Values}`` map back into metadata pairs (``-bin`` values become bytes again).

    Transport-reserved keys and HTTP/2 pseudo-headers (``:authority``, ``:path``..., which Go peers such as
    upstream kas include in the metadata they forward) are dropped: grpcio refuses them as header keys.
    """
    pairs: list[tuple[str, str | bytes]] = []
    for key, entry in values.items():
        if key in _RESERVED or key.startswith(":"):
            continue
        for value in entry.value:
            pairs.append((key, value.encode("latin-1") if key.endswith("-bin") else value))
    return tuple(pairs)


def status_to_proto(
    code: grpc.StatusCode, message: str, trailers: Iterable[tuple[str, str | bytes]] = ()
) -> status_pb2.Status:
    """Build a ``google.rpc.Status`` from a call outcome, keeping details from ``grpc-status-details-bin``."""
    status = status_pb2.Status(code=code.value[0], message=message)
    for key, value in trailers:
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            detailed = status_pb2.Status.FromString(value)
            status.details.extend(detailed.details)
    return status


def code_from_int(code: int) -> grpc.StatusCode:
    """Map a numeric status code to :class:`grpc.StatusCode` (unknown numbers become ``UNKNOWN``)."""
    for candidate in grpc.StatusCode:
        if candidate.value[0] == code:
            return candidate
    return grpc.StatusCode.UNKNOWN


#: Tether addition (issue 9 item 7): the caller's remaining deadline in milliseconds when the call was
#: routed; agentk bounds the call it makes for the tunnel by it (gRPC's own deadline ends at the tunnel).
TIMEOUT_MS_KEY = "tether-timeout-ms"
#: Longest deadline carried (a day); larger values are clamped.
_MAX_TIMEOUT_MS = 86_400_000


def timeout_entry(timeout_s: float) -> tuple[str, str]:
    """The metadata entry carrying a ``timeout_s`` seconds deadline."""
    return TIMEOUT_MS_KEY, str(max(1, min(int(timeout_s * 1000), _MAX_TIMEOUT_MS)))


def timeout_from(metadata: MetadataIn | None) -> float | None:
    """The deadline in seconds from :data:`TIMEOUT_MS_KEY`, or None when absent or malformed."""
    for key, value in metadata or ():
        if key == TIMEOUT_MS_KEY:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            if text.isascii() and text.isdigit() and len(text) <= 9:
                return max(1, min(int(text), _MAX_TIMEOUT_MS)) / 1000
    return None
