"""Durations in configuration files, written as protobuf JSON / Go durations ("300s", "1h30m", "0.5s")."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """Return seconds for ``value``: a number of seconds, or a string like ``"300s"``, ``"2h"``, ``"1m30s"``.

    Raises:
        ValueError: when the text is not a sequence of ``<number><ms|s|m|h>`` parts, or is negative.
    """
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '300s'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = _PART.findall(text)
        if "".join(n + u for n, u in parts) != text:
            raise ValueError(f"invalid duration {value!r}: use forms like '300s', '5m', '2h', '1m30s'")
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise ValueError("a duration must be a number of seconds or a string like '300s'")
    if seconds < 0:
        raise ValueError(f"duration {value!r} is negative")
    return seconds


#: A pydantic field type holding seconds, accepting numbers and duration strings.
Duration = Annotated[float, BeforeValidator(parse_duration)]
