"""Records to wire events (imported with the first event: msgspec and the protocol load only then)."""

from __future__ import annotations

import msgspec

from tether.modserver.audit import AuditRecord
from tether.modules.audit.protocol import CLUSTER_AGENT, CLUSTER_IMPERSONATE, AuditEvent, ClusterIdentity

__all__ = ["encode", "event_of"]

_ENCODER = msgspec.json.Encoder()
_AGENT = ClusterIdentity(kind=CLUSTER_AGENT)


def event_of(record: AuditRecord, kas_instance: str) -> AuditEvent:
    """The wire event of a finished record."""
    identity = _AGENT
    if record.impersonated is not None:
        user, groups = record.impersonated
        identity = ClusterIdentity(kind=CLUSTER_IMPERSONATE, user=user, groups=list(groups))
    return AuditEvent(
        id=record.id,
        time=record.time,
        kind=record.kind,
        agent_id=record.agent_id,
        kas_instance=kas_instance,
        verb=record.verb,
        status=record.status,
        duration_ms=round(record.duration_ms, 3),
        bytes_in=record.bytes_in,
        bytes_out=record.bytes_out,
        user_id=record.user_id,
        username=record.username,
        token_id=record.token_id,
        token_kind=record.token_kind,
        cluster_identity=identity,
        api_group=record.api_group,
        api_version=record.api_version,
        resource=record.resource,
        subresource=record.subresource,
        namespace=record.namespace,
        name=record.name,
        path=record.path,
        request_id=record.request_id,
        source_address=record.source_address,
        recording=record.recording,
    )


def encode(event: msgspec.Struct) -> bytes:
    """One JSON line: the event's JSON and a newline (the spool's and, joined, the batch's format)."""
    return _ENCODER.encode(event) + b"\n"
