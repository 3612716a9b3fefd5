"""kas spaces out full collections, young ones unchanged (issue 9: the collector's share of a connection storm)."""

from __future__ import annotations

import gc
import subprocess
import sys

from tether.tool.memory import FULL_COLLECTION_SPACING, space_full_collections


def test_full_collections_are_spaced_and_young_ones_unchanged() -> None:
    before = gc.get_threshold()
    try:
        space_full_collections()
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_SPACING)
        assert before[2] < FULL_COLLECTION_SPACING
    finally:
        gc.set_threshold(*before)


#: In a fresh interpreter: 100 MiB of 2 KiB C-heap blocks, one in ten kept (so free() alone cannot shrink the heap
#: from its top), then the RSS before and after ``freeze_startup_heap``, in KiB.
_START_UP_GARBAGE = """
from tether.tool.memory import freeze_startup_heap
def rss():
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS:")))
blocks = [bytes(2048) for _ in range(50_000)]
kept = blocks[::10]
del blocks
before = rss()
freeze_startup_heap()
print(before, rss())
"""


def test_startup_garbage_goes_back_to_the_system() -> None:
    """What start-up dropped leaves the process' RSS when it freezes its heap (issue 28 item 4)."""
    done = subprocess.run([sys.executable, "-c", _START_UP_GARBAGE], capture_output=True, text=True, check=True)
    before_kib, after_kib = (int(value) for value in done.stdout.split())
    assert before_kib - after_kib > 40 * 1024
