"""The time bounds a reader gives the audit trail (``since``/``until`` of ``GET /api/v4/audit_events``).

ISO 8601 as GitLab's list filters take them (``2026-11-26T10:00:00Z``; no zone means UTC; a bare date is its
midnight UTC), or unix seconds (``1795600000.5``), the form kas stamps events with.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime


def parse_time(text: str, field: str) -> datetime:
    """The instant ``text`` names, as an aware UTC datetime.

    Raises:
        ValueError: neither ISO 8601 nor unix seconds between 1970 and 9999; the message names ``field``.
    """
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not (math.isfinite(seconds) and 0 <= seconds < 253402300800):
            raise ValueError(f"{field}: {text[:40]!r} is not unix seconds between 1970 and 9999")
        return datetime.fromtimestamp(seconds, UTC)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{field}: {text[:40]!r} is not a time: use ISO 8601 (2026-11-26T10:00:00Z) or unix seconds"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
