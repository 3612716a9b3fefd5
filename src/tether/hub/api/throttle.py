"""Failed authentications per client address: sign-ins and unknown tokens (issue 9 item 4).

A client address with more than ``security.failed_auth_per_source_per_minute`` failures within a minute gets
429 (``Retry-After: 60``) before its credentials are even looked up; the refusals show in
``tether_rate_limited_total{limit="hub_auth_failures"}`` on ``/-/metrics``. Counts live in the hub process.
"""

from __future__ import annotations

from starlette.requests import Request

from tether.hub.errors import TooManyRequests
from tether.tool.rate_limit import RateLimiter, per_minute

__all__ = ["FailedAuthThrottle"]

_NAME = "hub_auth_failures"


class FailedAuthThrottle:
    """Counts failures per client address; see the module docstring.

    Args:
        per_minute: the limit; 0 turns the throttle off.
    """

    def __init__(self, per_minute_limit: int) -> None:
        self._limiter = RateLimiter(None, "hub") if per_minute_limit > 0 else None
        self._limit = per_minute(max(per_minute_limit, 1))

    async def check(self, request: Request) -> None:
        """Refuse a client address that failed too often.

        Raises:
            TooManyRequests: over the limit.
        """
        if self._limiter is not None and not await self._limiter.allows(_NAME, self._limit, _source(request)):
            raise TooManyRequests()

    async def failed(self, request: Request) -> None:
        """Count one failed authentication of the request's client address."""
        if self._limiter is not None:
            await self._limiter.hit(_NAME, self._limit, _source(request))


def _source(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"
