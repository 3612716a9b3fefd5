"""Memory housekeeping for the long-running processes (kas, agentk)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable


def freeze_startup_heap() -> None:
    """Move every object alive now to the collector's permanent generation; call once start-up is done.

    The modules, descriptors and configuration loaded at start-up live as long as the process, yet every full
    collection walked them: kas showed 36-47 ms pauses that landed on requests (routing benchmark wake-up
    p99). Frozen, they are never scanned again; objects created later are collected as usual.

    Then the C heap's free pages go back to the system (:func:`release_free_memory`): what start-up built and
    dropped (import-time objects, the parsed configuration file, schema building) left 1-3 MiB of free pages
    mapped in glibc's heap (issue 28 item 4: kas and agentk idle within 5 MiB of their libraries' import floor).
    """
    gc.collect()
    gc.freeze()
    release_free_memory()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the operating system (glibc ``malloc_trim(0)``); False elsewhere.

    Freed list pages and decode buffers stay mapped in glibc's heap after a burst (a graph's initial state:
    hundreds of pages of JSON), so RSS keeps their peak. Costs a walk of the heap (milliseconds); call it after
    such a burst, not per request.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


#: Youngest-generation collections per look at the oldest generation (CPython's default: 10 middle-generation
#: collections of 10 young ones each, i.e. ``gc.set_threshold(700, 10, 10)``).
FULL_COLLECTION_SPACING = 100


def space_full_collections() -> None:
    """Make full collections ten times rarer; young collections stay as they are.

    A server that keeps a few hundred objects per connection has a large old generation that every full
    collection walks: while 3,000 agents connected to kas, the collector took 3.6 s of kas' 6.3 s of CPU (and
    more at 10,000, where each full collection walks more), with no memory saved (issue 9). Cyclic garbage that
    survives into the old generation is rare there and still freed, just later.
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_SPACING)
