"""Rate limits shared by every replica through Redis, or per process in memory (``limits`` library).

Used for ``agent.listen.connections_per_token_per_minute`` (new agent RPCs per token, across all kas) and
for throttling failed sign-ins and unknown tokens per source address (issue 9 item 4). Keys are digests or
addresses, never secrets.

A check runs on a request's path, so Redis must never hold it up (issue 27 item 5): checks go through a
:class:`~tether.tool.circuit_breaker.CircuitBreaker`, and while Redis fails or stalls (refuses connections,
or is frozen and answers nothing) this process counts in memory instead, with the same limits, within
milliseconds of the failure and until Redis answers again. An unreachable Redis neither locks every agent out
nor lifts the limits; each such check counts in ``tether_rate_limit_storage_errors_total``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from prometheus_client import Counter

from tether.tool.circuit_breaker import CircuitBreaker
from tether.tool.rate_lease import PermitLeases, lease_size

if TYPE_CHECKING:
    from tether.tool.redis_pool import RedisTarget

__all__ = ["RATE_LIMITED", "RateLimiter", "per_minute"]

#: Requests refused by a rate limit, by limit name.
RATE_LIMITED = Counter("tether_rate_limited_total", "Requests refused by a rate limit", ["limit"])
_STORAGE_ERRORS = Counter(
    "tether_rate_limit_storage_errors_total",
    "Rate limit checks counted in this process because the shared storage failed or stalled",
)


def per_minute(amount: int) -> RateLimitItem:
    """A limit of ``amount`` hits per minute."""
    return RateLimitItemPerMinute(amount)


class RateLimiter:
    """Sliding-window counters per (limit name, key).

    Args:
        redis: where the shared counts live: a URL (``redis://host:port/db``, ``rediss://...``,
            ``unix:///path?db=N``) or a :class:`~tether.tool.redis_pool.RedisTarget` (one server or a
            Sentinel-managed master); None counts in process memory.
        key_prefix: prefix of the Redis keys (e.g. ``gitlab-kas:rate_limit``).
        timeout_s: socket timeout of the Redis client, in seconds (the breaker gives up long before).
        pool_size: most Redis connections open at once.
        pool_timeout_s: seconds a check waits for a free connection when all are busy (then it counts locally).

    The Redis pool blocks for a free connection, as kas' main Redis pool does: redis-py's default pool fails at
    once beyond its size, and when 1,000 agents connected together 700 checks failed open that way (issue 9).
    Waiting there is not a stall while Redis keeps answering other checks (see the breaker).

    During a Sentinel failover the checks fail until the sentinels name the new master: the breaker opens at the
    first failure, checks count in memory meanwhile, and the first probe the new master answers closes it.
    """

    def __init__(
        self,
        redis: str | RedisTarget | None,
        key_prefix: str,
        timeout_s: float = 3.0,
        pool_size: int = 100,
        pool_timeout_s: float = 5.0,
    ) -> None:
        self._local = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._leases = PermitLeases()
        self._shared: SlidingWindowCounterRateLimiter | None = None
        self._breaker: CircuitBreaker | None = None
        if redis is not None:
            from limits.aio.storage import RedisStorage  # noqa: PLC0415 (redis-py only when configured)

            from tether.tool.redis_pool import RedisTarget, blocking_pool  # noqa: PLC0415

            target = RedisTarget(url=redis) if isinstance(redis, str) else redis
            pool = blocking_pool(
                target,
                max_connections=pool_size,
                timeout_s=pool_timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
            # With a pool, limits takes only the scheme from the URI (the pool knows the server or sentinels).
            # limits documents ``connection_pool`` but types its options as scalars.
            storage: Storage = RedisStorage(
                "async+redis://",
                implementation="redispy",
                key_prefix=key_prefix,
                connection_pool=pool,  # type: ignore[arg-type]
            )
            self._shared = SlidingWindowCounterRateLimiter(storage)
            self._breaker = CircuitBreaker("rate_limit", lambda: _ping(storage))

    async def hit(self, name: str, limit: RateLimitItem, key: str) -> bool:
        """Count one hit of ``key`` against ``limit``; False when the limit is exceeded (the hit is refused).

        With shared counts and a limit of 128 or more per window, permits are taken from Redis in blocks of up to
        16 and spent here (:mod:`tether.tool.rate_lease`): one round trip per block, never more than the limit.

        Args:
            name: the limit's name (metric label and key part), e.g. ``agent_rpc``.
            limit: e.g. :func:`per_minute` (40000).
            key: what is limited, e.g. a token digest in hex or a source address.
        """
        size = lease_size(limit.amount)
        if size > 1 and self._shared is not None:
            # A busy key takes its permits from Redis in blocks (tool/rate_lease.py): never more than the limit.
            async def refill(cost: int) -> bool:
                return await self._check("hit", name, limit, key, cost=cost, counted=False)

            if await self._leases.take((name, key), size, refill):
                return True
        return await self._check("hit", name, limit, key)

    async def allows(self, name: str, limit: RateLimitItem, key: str) -> bool:
        """Whether ``key`` is under ``limit``, without counting a hit (check first; :meth:`hit` on failure)."""
        return await self._check("test", name, limit, key)

    async def _check(
        self, how: str, name: str, limit: RateLimitItem, key: str, cost: int = 1, counted: bool = True
    ) -> bool:
        """``hit`` (``cost`` permits) or ``test``; ``counted``: a refusal counts in ``tether_rate_limited_total``."""
        allowed: bool | None = None
        if self._shared is not None and self._breaker is not None:
            shared: Callable[..., Awaitable[bool]] = getattr(self._shared, how)
            try:
                allowed = await self._breaker.call(lambda: shared(limit, name, key, cost=cost))
            except Exception:  # CircuitOpen, or the error that opened the circuit (the breaker logged it)
                _STORAGE_ERRORS.inc()
        if allowed is None:
            local: Callable[..., Awaitable[bool]] = getattr(self._local, how)
            allowed = await local(limit, name, key, cost=cost)
        if not allowed and counted:
            RATE_LIMITED.labels(limit=name).inc()
        return allowed

    async def prime(self) -> None:
        """Ask Redis once at start (:meth:`~tether.tool.circuit_breaker.CircuitBreaker.prime`); nothing in memory."""
        if self._breaker is not None:
            await self._breaker.prime()

    async def close(self) -> None:
        """Stop probing a stalled Redis."""
        if self._breaker is not None:
            await self._breaker.close()


async def _ping(storage: Storage) -> None:
    if not await storage.check():
        raise ConnectionError("Redis did not answer PING")
