"""Row ids as the hub accepts them in request parameters (see ``tether.tool.ids`` for the rule).

Path and query parameters typed :data:`RowId` are refused with 400 when out of range; references that may
be an id or a path (``/projects/:id``) use ``tether.tool.ids.parse_id`` and answer 404 for a number out of
range (issue 9 item 7: SQLite overflowed, ``str.isdigit`` let ``²`` reach ``int()``, both were HTTP 500).
"""

from __future__ import annotations

from typing import Annotated

import annotated_types

from tether.tool.ids import MAX_ID

__all__ = ["RowId"]

#: An integer request parameter naming a row: out of range is a validation error (HTTP 400).
RowId = Annotated[int, annotated_types.Interval(ge=1, le=MAX_ID)]
