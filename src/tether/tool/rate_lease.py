"""Permits of a shared rate limit taken from Redis in blocks and spent in process memory (issue 28).

A busy key (an agent token opening a tunnel per forwarded call, 10,000 agents opening three streams each) cost a
Redis round trip per hit. A lease takes ``size`` permits in one hit of cost ``size`` and hands them out here for
at most :data:`LEASE_S`. The permits are counted in the shared window when taken, so the limit still holds across
every process: unused ones simply expire (a little stricter, never looser). Concurrent hits of one key wait for
the one refill in flight instead of each taking a block.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from cachetools import TTLCache

__all__ = ["LEASE_S", "PermitLeases", "lease_size"]

#: Seconds the permits of one block stay usable in this process.
LEASE_S = 1.0
#: Most permits in one block.
LEASE_MAX = 16
#: A block is at most this share of the limit (1/64): limits under 128 a minute are checked hit by hit.
_SHARE = 64
#: Keys with a lease at once (about 200 bytes each); the oldest go first beyond it.
_MAX_KEYS = 65_536


def lease_size(amount: int) -> int:
    """Permits per block for a limit of ``amount`` per window: 1 (no lease) up to :data:`LEASE_MAX`."""
    return max(1, min(LEASE_MAX, amount // _SHARE))


class _Lease:
    __slots__ = ("left", "refill", "until")

    def __init__(self) -> None:
        self.left = 0
        self.until = 0.0
        self.refill: asyncio.Future[bool] | None = None


class PermitLeases:
    """Blocks of permits per key.

    Args:
        clock: monotonic seconds (tests replace it).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._leases: TTLCache[tuple[str, str], _Lease] = TTLCache(_MAX_KEYS, 2 * LEASE_S, timer=clock)

    async def take(self, slot: tuple[str, str], size: int, refill: Callable[[int], Awaitable[bool]]) -> bool:
        """Spend one permit of ``slot``'s block, taking a new block of ``size`` with ``refill(size)`` when empty.

        Returns:
            True when a permit was spent; False when the shared limit refused the block (the caller then checks
            this hit alone, exactly: near the limit every permit counts).

        Raises:
            Exception: whatever ``refill`` raised (its waiters then get False).
        """
        while True:
            lease = self._leases.get(slot)
            if lease is None:
                lease = self._leases[slot] = _Lease()
            if lease.left > 0 and self._clock() < lease.until:
                lease.left -= 1
                return True
            if lease.refill is None:
                break
            if not await asyncio.shield(lease.refill):
                return False
        pending = lease.refill = asyncio.get_running_loop().create_future()
        granted = False
        try:
            granted = await refill(size)
            if granted:
                lease.left, lease.until = size - 1, self._clock() + LEASE_S
            return granted
        finally:
            lease.refill = None
            pending.set_result(granted)
