"""kas spaces out full collections, young ones unchanged (issue 9: the collector's share of a connection storm)."""

from __future__ import annotations

import gc

from tether.tool.memory import FULL_COLLECTION_SPACING, space_full_collections


def test_full_collections_are_spaced_and_young_ones_unchanged() -> None:
    before = gc.get_threshold()
    try:
        space_full_collections()
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_SPACING)
        assert before[2] < FULL_COLLECTION_SPACING
    finally:
        gc.set_threshold(*before)
