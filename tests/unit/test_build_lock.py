"""Two builds of the Kubernetes test binaries never share the partial directory: the second one waits."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

from tether_devenv.build import _exclusive


def test_a_second_build_waits_for_the_first(tmp_path: Path) -> None:
    lock_path = tmp_path / ".build.lock"
    lines: list[str] = []
    entered = threading.Event()

    def second_build() -> None:
        with _exclusive(lock_path, lines.append):
            entered.set()

    with lock_path.open("w") as first:
        fcntl.flock(first, fcntl.LOCK_EX)
        waiter = threading.Thread(target=second_build)
        waiter.start()
        assert not entered.wait(0.5)
        fcntl.flock(first, fcntl.LOCK_UN)
    waiter.join(10)
    assert entered.is_set()
    assert len(lines) == 1 and "another build" in lines[0] and "waiting" in lines[0]
