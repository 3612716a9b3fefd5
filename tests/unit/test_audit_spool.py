"""The audit spool: append-only segments, a size cap, torn lines, and what a new process finds (issue 25)."""

from __future__ import annotations

from pathlib import Path

from tether.modules.audit.server.spool import Spool


def lines(*ids: str) -> list[bytes]:
    return [f'{{"id":"{i}"}}\n'.encode() for i in ids]


def test_appended_events_are_read_back_in_order_by_a_new_process(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10_000)
    assert spool.append(lines("a", "b")) == 2
    assert spool.append(lines("c")) == 1
    # Not closed: a SIGKILLed kas leaves the segment as written.
    again = Spool(tmp_path, 10_000)
    oldest = again.oldest()
    assert oldest is not None and oldest[1] == lines("a", "b", "c")
    again.remove(oldest[0])
    assert again.empty and again.size == 0 and not list(tmp_path.iterdir())


def test_the_cap_refuses_what_does_not_fit(tmp_path: Path) -> None:
    one = len(lines("a")[0])
    spool = Spool(tmp_path, one * 3)
    assert spool.append(lines("a", "b")) == 2
    assert spool.append(lines("c", "d", "e")) == 1
    assert spool.append(lines("f")) == 0
    assert spool.size == one * 3


def test_a_torn_last_line_is_skipped_and_new_appends_go_to_a_new_segment(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10_000)
    spool.append(lines("a"))
    spool.close()
    segment = next(tmp_path.iterdir())
    with segment.open("ab") as f:
        f.write(b'{"id":"tor')  # a crash in the middle of a write
    again = Spool(tmp_path, 10_000)
    again.append(lines("b"))
    first = again.oldest()
    assert first is not None and first[1] == lines("a")
    again.remove(first[0])
    second = again.oldest()
    assert second is not None and second[1] == lines("b") and second[0] != first[0]
