"""The connection id kas reads from agentk's metadata (issue 9 item 6): only a well-formed int63 is trusted."""

from __future__ import annotations

import pytest

from tether.tool.logs import CONNECTION_ID_METADATA, bind, connection_id_from, current_connection_id


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("42", 42),
        (str(2**63 - 1), 2**63 - 1),
        (str(2**63), None),
        ("0", None),
        ("-1", None),
        ("²", None),  # str.isdigit accepts it, int() does not
        ("١٢", None),  # Arabic-Indic digits: int() accepts them, a connection id is ASCII
        (" 1", None),
        ("", None),
        ("9" * 400, None),
    ],
)
def test_connection_id_from_metadata(value: str, expected: int | None) -> None:
    assert connection_id_from([("authorization", "Bearer x"), (CONNECTION_ID_METADATA, value)]) == expected


def test_connection_id_absent_or_binary() -> None:
    assert connection_id_from(None) is None
    assert connection_id_from([("authorization", "Bearer x")]) is None
    assert connection_id_from([(CONNECTION_ID_METADATA, b"12")]) is None


def test_bound_connection_id_is_seen_and_unbound_after() -> None:
    with bind(connection_id=7):
        assert current_connection_id() == 7
    assert current_connection_id() is None
