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


def _text(value: str, limit: int, scrub: bool) -> str:
    if scrub:
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate, which JSON's \ud800 escape can carry
            value = _SURROGATE.sub("\ufffd", value)
    return value if len(value) <= limit else value[:limit]


def _out_of_range(field: str, value: int, low: int) -> BatchError:
    return BatchError(f"{field}: {value} is out of range ({low}..{_INT64_MAX})")


def _check(event: AuditEvent, index: int) -> None:
    where = f"$.events[{index}]"  # cheap next to the checks; kept for the messages
    if not _ID.fullmatch(event.id):
        raise BatchError(f"{where}.id: {event.id[:64]!r} is not 32 lowercase hex digits (a uuid4 hex)")
    if not (math.isfinite(event.time) and 0 < event.time <= _MAX_TIME):
        raise BatchError(f"{where}.time: {event.time} is not unix seconds between 1970 and 9999")
    if not (math.isfinite(event.duration_ms) and event.duration_ms >= 0):
        raise BatchError(f"{where}.duration_ms: {event.duration_ms} is not a duration (finite, 0 or more)")
    if not event.kind:
        raise BatchError(f"{where}.kind: must not be empty")
    for field in ("agent_id", "status", "bytes_in", "bytes_out", "user_id", "token_id"):
        if not 0 <= (value := getattr(event, field)) <= _INT64_MAX:
            raise _out_of_range(f"{where}.{field}", value, 0)


def _clean(event: AuditEvent, index: int, scrub: bool) -> AuditEvent:
    """``event`` checked (:class:`BatchError`) and with storable text; ``scrub``: look for NUL and surrogates."""
    _check(event, index)
    changes: dict[str, object] = {}
    for field, limit in TEXT_LIMITS.items():
        value = getattr(event, field)
        if (scrub or len(value) > limit) and (cleaned := _text(value, limit, scrub)) != value:
            changes[field] = cleaned
    identity = event.cluster_identity
    if identity is not None:
        groups = identity.groups[:MAX_GROUPS]
        cleaned_identity = ClusterIdentity(
            kind=_text(identity.kind, 32, scrub),
            user=_text(identity.user, _IDENTITY_LIMIT, scrub),
            groups=[_text(group, _GROUP_LIMIT, scrub) for group in groups],
        )
        if cleaned_identity != identity:
            changes["cluster_identity"] = cleaned_identity
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
            duration or count, an integer below 0 or beyond int64, or an empty ``kind``. ``agent_id`` 0 means
            no agent known (a request kas refused before it knew the agent, e.g. one without credentials).
    """
    # A NUL or a lone surrogate reaches a string only through a JSON escape (raw control characters and
    # invalid UTF-8 are refused), and msgspec refuses lone surrogate escapes: only these bodies need scrubbing.
    scrub = b"\\u0000" in raw
    try:
        batch = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise BatchError(f"malformed batch: {exc}") from None
    except msgspec.DecodeError as exc:
        batch, scrub = _decode_lenient(raw, exc), True
    if len(batch.events) > MAX_EVENTS:
        raise BatchError(f"$.events: {len(batch.events)} events, at most {MAX_EVENTS} in one batch")
    seen: set[str] = set()
    events = []
    for index, event in enumerate(batch.events):
        cleaned = _clean(event, index, scrub)
        if cleaned.id not in seen:
            seen.add(cleaned.id)
            events.append(cleaned)
    return events, len(batch.events)
