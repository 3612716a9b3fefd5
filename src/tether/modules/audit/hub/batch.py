"""A batch of audit events as kas posts it (AUDIT_CONTRACT.md "The hub's internal API"), decoded and checked.

:func:`decode_batch` turns the body ``{"events": [AuditEvent, ...]}`` into events the hub can store, or raises
:class:`BatchError` naming the first problem (``$.events[3].agent_id: ...``): a batch is stored whole or not at
all. Shapes are checked, not vocabularies: a newer kas may send a ``kind`` or ``verb`` this hub does not know,
and an event is never refused for it (a refused batch would be dropped by kas, an event lost).

Text that a database cannot hold is made storable rather than refused, because a client chooses much of it
(the path, the object name) and must not be able to hide its request from the trail by choosing it badly: NUL
characters and lone surrogates become U+FFFD, and overlong fields are cut at :data:`TEXT_LIMITS`.
"""

from __future__ import annotations

import json
import math
import re

import msgspec

from tether.modules.audit.protocol import AuditEvent, ClusterIdentity

#: Events in one batch at most (the contract; kas' ``audit.batch_max_events`` defaults to 500).
MAX_EVENTS = 1000
#: Bytes of one batch's body at most (the contract).
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Characters each text field keeps (the columns of ``audit_events``); the rest is cut.
TEXT_LIMITS: dict[str, int] = {
    "kind": 32,
    "kas_instance": 255,
    "verb": 64,
    "username": 255,
    "token_kind": 32,
    "api_group": 253,
    "api_version": 64,
    "resource": 253,
    "subresource": 253,
    "namespace": 253,
    "name": 253,
    "path": 4096,
    "request_id": 128,
    "source_address": 128,
    "recording": 16,
}
#: Impersonated groups kept per event, each cut at 253 characters.
MAX_GROUPS = 64
_GROUP_LIMIT = 253
_IDENTITY_LIMIT = 255
_ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, as kas makes it
_INT64_MAX = 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Latest event time accepted (year 9999: beyond it a timestamp column overflows).
_MAX_TIME = 253402300799.0


class BatchError(ValueError):
    """The batch is malformed; the message names the field (``$.events[0].time: ...``)."""


class Batch(msgspec.Struct):
    """The request body. Unknown fields are ignored (a newer kas may add some)."""

    events: list[AuditEvent]


def _text(value: str, limit: int) -> str:
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \ud800 escape can carry
        value = _SURROGATE.sub("\ufffd", value)
    return value[:limit]


def _check_int(where: str, value: int, low: int) -> None:
    if not low <= value <= _INT64_MAX:
        raise BatchError(f"{where}: {value} is out of range ({low}..{_INT64_MAX})")


def _clean(event: AuditEvent, where: str) -> AuditEvent:
    if not _ID.fullmatch(event.id):
        raise BatchError(f"{where}.id: {event.id[:64]!r} is not 32 lowercase hex digits (a uuid4 hex)")
    if not (math.isfinite(event.time) and 0 < event.time <= _MAX_TIME):
        raise BatchError(f"{where}.time: {event.time} is not unix seconds between 1970 and 9999")
    if not (math.isfinite(event.duration_ms) and event.duration_ms >= 0):
        raise BatchError(f"{where}.duration_ms: {event.duration_ms} is not a duration (finite, 0 or more)")
    if not event.kind:
        raise BatchError(f"{where}.kind: must not be empty")
    _check_int(f"{where}.agent_id", event.agent_id, 1)
    _check_int(f"{where}.status", event.status, 0)
    for field in ("bytes_in", "bytes_out", "user_id", "token_id"):
        _check_int(f"{where}.{field}", getattr(event, field), 0)
    changes: dict[str, object] = {}
    for field, limit in TEXT_LIMITS.items():
        value = getattr(event, field)
        if (cleaned := _text(value, limit)) != value:
            changes[field] = cleaned
    identity = event.cluster_identity
    if identity is not None:
        changes["cluster_identity"] = ClusterIdentity(
            kind=_text(identity.kind, 32),
            user=_text(identity.user, _IDENTITY_LIMIT),
            groups=[_text(group, _GROUP_LIMIT) for group in identity.groups[:MAX_GROUPS]],
        )
    return msgspec.structs.replace(event, **changes) if changes else event


_decoder = msgspec.json.Decoder(Batch)


def _decode_lenient(raw: bytes, error: msgspec.DecodeError) -> Batch:
    # msgspec refuses JSON escapes of lone surrogates (\\ud800), which a client's undecodable path bytes can
    # become on the way (Python's surrogateescape); the standard library reads them, and _clean replaces them.
    try:
        loaded = json.loads(raw)
    except (ValueError, RecursionError):
        raise BatchError(f"the body is not JSON: {error}") from None
    try:
        return msgspec.convert(loaded, Batch)
    except msgspec.ValidationError as exc:
        raise BatchError(f"malformed batch: {exc}") from None


def decode_batch(raw: bytes) -> tuple[list[AuditEvent], int]:
    """The events of a batch body, checked and made storable; a repeated ``id`` is kept once.

    Args:
        raw: the JSON body, at most :data:`MAX_BATCH_BYTES` (the caller enforces the size while reading).

    Returns:
        (the events in body order, the first of each ``id`` only; how many events the body held).

    Raises:
        BatchError: not JSON, not ``{"events": [...]}``, a field of the wrong type, more than
            :data:`MAX_EVENTS` events, an ``id`` that is not a uuid4 hex, a time outside 1970-9999, a negative
            duration or count, an ``agent_id`` below 1, an integer beyond int64, or an empty ``kind``.
    """
    try:
        batch = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise BatchError(f"malformed batch: {exc}") from None
    except msgspec.DecodeError as exc:
        batch = _decode_lenient(raw, exc)
    if len(batch.events) > MAX_EVENTS:
        raise BatchError(f"$.events: {len(batch.events)} events, at most {MAX_EVENTS} in one batch")
    seen: set[str] = set()
    events = []
    for index, event in enumerate(batch.events):
        cleaned = _clean(event, f"$.events[{index}]")
        if cleaned.id not in seen:
            seen.add(cleaned.id)
            events.append(cleaned)
    return events, len(batch.events)
