"""Routing metadata: the destination agent id rides in ``kas-hop-routing-agent-id`` (kas.md §2.2)."""

from __future__ import annotations

from tether.tool.grpc_meta import Metadata, MetadataIn
from tether.tool.ids import parse_id

ROUTING_AGENT_ID_KEY = "kas-hop-routing-agent-id"
HOP_PREFIX = "kas-hop-"
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


class RoutingMetadataError(ValueError):
    """The routing metadata is missing, repeated or not a positive integer."""


def routing_agent_id(metadata: MetadataIn | None) -> int:
    """Return the single decimal agent id in ``kas-hop-routing-agent-id``.

    Raises:
        RoutingMetadataError: missing, repeated, not an integer, or not positive.
    """
    values = [v for k, v in metadata or () if k == ROUTING_AGENT_ID_KEY]
    if len(values) != 1:
        raise RoutingMetadataError(f"expected exactly one {ROUTING_AGENT_ID_KEY} metadata value, got {len(values)}")
    value = values[0]
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    agent_id = parse_id(text)
    if agent_id is None:
        raise RoutingMetadataError(f"{ROUTING_AGENT_ID_KEY} must be a positive decimal integer, got {text[:40]!r}")
    return agent_id


def forwardable(metadata: MetadataIn | None) -> Metadata:
    """Metadata for agentk: everything except ``kas-hop-*`` keys and the kas-to-kas ``authorization``."""
    return tuple((k, v) for k, v in metadata or () if not k.startswith(HOP_PREFIX) and k != "authorization")


def split_method(full_method: str) -> tuple[str, str]:
    """Split ``/package.Service/Method`` into (``package.Service``, ``Method``).

    Raises:
        RoutingMetadataError: the name is not of that form.
    """
    parts = full_method.split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
        raise RoutingMetadataError(f"malformed method name {full_method!r}")
    return parts[1], parts[2]
