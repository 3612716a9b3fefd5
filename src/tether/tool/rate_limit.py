"""Rate limits shared by every replica through Redis, or per process in memory (``limits`` library).

Used for ``agent.listen.connections_per_token_per_minute`` (new agent RPCs per token, across all kas) and
for throttling failed sign-ins and unknown tokens per source address (issue 9 item 4). Keys are digests or
addresses, never secrets. A limiter whose storage fails lets the request through (an unreachable Redis
must not lock every agent out) and counts the failure in ``tether_rate_limit_storage_errors_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from prometheus_client import Counter

__all__ = ["RATE_LIMITED", "RateLimiter", "per_minute"]

log = logging.getLogger(__name__)

#: Requests refused by a rate limit, by limit name.
RATE_LIMITED = Counter("tether_rate_limited_total", "Requests refused by a rate limit", ["limit"])
_STORAGE_ERRORS = Counter(
    "tether_rate_limit_storage_errors_total", "Rate limit checks that failed open because the storage failed"
)


def per_minute(amount: int) -> RateLimitItem:
    """A limit of ``amount`` hits per minute."""
    return RateLimitItemPerMinute(amount)


class RateLimiter:
    """Sliding-window counters per (limit name, key).

    Args:
        redis_url: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path?db=N`` to share counts between
            replicas; None counts in process memory.
        key_prefix: prefix of the Redis keys (e.g. ``gitlab-kas:rate_limit``).
        timeout_s: socket timeout of the Redis client, in seconds.
        pool_size: most Redis connections open at once.
        pool_timeout_s: seconds a check waits for a free connection when all are busy (then it fails open).

    The Redis pool blocks for a free connection, as kas' main Redis pool does: redis-py's default pool fails at
    once beyond its size, and when 1,000 agents connected together 700 checks failed open that way (issue 9).
    """

    def __init__(
        self,
        redis_url: str | None,
        key_prefix: str,
        timeout_s: float = 3.0,
        pool_size: int = 100,
        pool_timeout_s: float = 5.0,
    ) -> None:
        self._storage: Storage
        if redis_url is None:
            self._storage = MemoryStorage()
        else:
            import redis.asyncio as aioredis  # noqa: PLC0415 (redis-py only when configured)
            from limits.aio.storage import RedisStorage  # noqa: PLC0415

            scheme, _, rest = redis_url.partition("://")
            uri = f"async+redis+unix://{rest}" if scheme == "unix" else f"async+{redis_url}"
            pool = aioredis.BlockingConnectionPool.from_url(
                redis_url,
                max_connections=pool_size,
                timeout=pool_timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
            # limits documents ``connection_pool`` but types its options as scalars.
            self._storage = RedisStorage(
                uri,
                implementation="redispy",
                key_prefix=key_prefix,
                connection_pool=pool,  # type: ignore[arg-type]
            )
        self._limiter = SlidingWindowCounterRateLimiter(self._storage)

    async def hit(self, name: str, limit: RateLimitItem, key: str) -> bool:
        """Count one hit of ``key`` against ``limit``; False when the limit is exceeded (the hit is refused).

        Args:
            name: the limit's name (metric label and key part), e.g. ``agent_rpc``.
            limit: e.g. :func:`per_minute` (40000).
            key: what is limited, e.g. a token digest in hex or a source address.
        """
        return await self._check(self._limiter.hit, name, limit, key)

    async def allows(self, name: str, limit: RateLimitItem, key: str) -> bool:
        """Whether ``key`` is under ``limit``, without counting a hit (check first; :meth:`hit` on failure)."""
        return await self._check(self._limiter.test, name, limit, key)

    @staticmethod
    async def _check(check: Callable[..., Awaitable[bool]], name: str, limit: RateLimitItem, key: str) -> bool:
        try:
            allowed = await check(limit, name, key)
        except Exception as exc:
            _STORAGE_ERRORS.inc()
            log.warning("rate limit storage failed, letting the request through: %r", exc)
            return True
        if not allowed:
            RATE_LIMITED.labels(limit=name).inc()
        return allowed
