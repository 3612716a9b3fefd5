"""Routing metadata: the destination agent id rides in ``kas-hop-routing-agent-id`` (kas.md §2.2)."""

from __future__ import annotations

from tether.tool.grpc_meta import Metadata, MetadataIn
from tether.tool.ids import parse_id

ROUTING_AGENT_ID_KEY = "kas-hop-routing-agent-id"
HOP_PREFIX = "kas-hop-"


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
