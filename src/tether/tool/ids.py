"""Parsing ids that arrive as text (agent ids in tokens, headers, metadata; row ids in URLs).

An id is ASCII decimal in 1..2**63 - 1 (GitLab's ids are signed 64-bit). ``str.isdigit`` alone is not enough:
it accepts ``²`` and other Unicode digits that ``int()`` refuses or reads differently, and an unbounded number
overflows the database (issue 9 item 7: both were HTTP 500).
"""

from __future__ import annotations

__all__ = ["MAX_ID", "is_ascii_number", "parse_id"]

#: The largest id a signed 64-bit integer holds.
MAX_ID = 2**63 - 1
_MAX_DIGITS = len(str(MAX_ID))


def is_ascii_number(text: str) -> bool:
    """Whether ``text`` is a non-empty run of the ASCII digits ``0``-``9`` only."""
    return text.isascii() and text.isdigit()


def parse_id(ref: str | int) -> int | None:
    """The id ``ref`` names when it is an int or ASCII decimal within 1..:data:`MAX_ID`, else None.

    Leading zeros are allowed; signs, spaces, underscores and non-ASCII digits are not.
    """
    if isinstance(ref, str):
        if not is_ascii_number(ref) or len(ref.lstrip("0")) > _MAX_DIGITS:
            return None
        ref = int(ref)
    return ref if 1 <= ref <= MAX_ID else None
