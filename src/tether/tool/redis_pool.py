"""Where kas' Redis is and a blocking connection pool to it: one server, or a master found through Sentinel.

Upstream kas connects to one server or asks Redis Sentinel for the master (``redis.sentinel``: ``master_name``,
``addresses``, ``sentinel_password_file``; kas.md §3.1). Discovery and failover handling are redis-py's own
(``redis.asyncio.sentinel``): each new connection asks the sentinels for the current master, idle connections
to a former master are dropped when the answer changes, and a connection whose server turned read-only (a
demoted master) is closed with a ``ConnectionError``. Commands that fail while no master is known fail like
commands to a stopped server: callers already treat Redis as unavailable then.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import BlockingConnectionPool, SSLConnection
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

__all__ = ["RedisTarget", "SentinelMaster", "TlsFiles", "blocking_pool", "close_client"]


@dataclass(frozen=True)
class SentinelMaster:
    """A master monitored by sentinels.

    Attributes:
        master_name: the name in the sentinels' ``sentinel monitor <name> ...``.
        sentinels: ``(host, port)`` of each sentinel; the first that answers is used.
        password: the sentinels' own password (their ``requirepass``), or None.
    """

    master_name: str
    sentinels: tuple[tuple[str, int], ...]
    password: str | None = None


@dataclass(frozen=True)
class TlsFiles:
    """TLS to Redis and to the sentinels: CA to verify servers with (None: the system's), client pair or None."""

    ca_certificate_file: Path | None = None
    certificate_file: Path | None = None
    key_file: Path | None = None

    def connection_kwargs(self) -> dict[str, Any]:
        """redis-py connection arguments: TLS on, server certificate verified (and its host name)."""
        return {
            "ssl": True,
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
            "ssl_check_hostname": True,
            "ssl_ca_certs": str(self.ca_certificate_file) if self.ca_certificate_file else None,
            "ssl_certfile": str(self.certificate_file) if self.certificate_file else None,
            "ssl_keyfile": str(self.key_file) if self.key_file else None,
        }


@dataclass(frozen=True)
class RedisTarget:
    """One Redis server (``url``) or a Sentinel-managed master (``sentinel``), with the data servers' credentials.

    Attributes:
        url: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path?db=N``, without credentials; None with
            ``sentinel``.
        sentinel: the master's sentinels; None with ``url``.
        username: ACL user of the data servers (master and replicas), or None.
        password: their password (``requirepass``), or None.
        db: database index (with ``sentinel``; a URL carries its own).
        tls: TLS to the data servers and the sentinels, or None.
    """

    url: str | None = None
    sentinel: SentinelMaster | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: TlsFiles | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.sentinel is None):
            raise ValueError("a Redis target is one URL or one Sentinel-managed master")


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    # redis-py's Sentinel pool fails at once when all connections are busy (its base pool); kas' pools wait for a
    # free connection instead (issue 9 item 3). The method resolution order gives Sentinel's connection handling
    # on top of the blocking pool's get_connection/release.
    pass


def blocking_pool(
    target: RedisTarget, *, max_connections: int, timeout_s: float, **connection_kwargs: Any
) -> aioredis.ConnectionPool:
    """A pool of at most ``max_connections`` connections; a caller waits up to ``timeout_s`` for a free one.

    Args:
        target: where Redis is.
        max_connections: most connections open at once.
        timeout_s: seconds to wait for a free connection, then ``redis.exceptions.ConnectionError``.
        connection_kwargs: further redis-py connection arguments (timeouts, ``client_name``, ``retry``...);
            the sentinels get the ``socket_*`` ones and ``client_name``.
    """
    credentials = {"username": target.username, "password": target.password}
    tls = target.tls.connection_kwargs() if target.tls else {}
    if target.url is not None:
        if tls.pop("ssl", False):  # a connection class, not an argument, for one server
            connection_kwargs["connection_class"] = SSLConnection
        return BlockingConnectionPool.from_url(
            target.url, max_connections=max_connections, timeout=timeout_s, **credentials, **tls, **connection_kwargs
        )
    assert target.sentinel is not None
    sentinel_kwargs = {
        key: value for key, value in connection_kwargs.items() if key.startswith("socket_") or key == "client_name"
    }
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinel.sentinels),
        sentinel_kwargs={"password": target.sentinel.password, **tls, **sentinel_kwargs},
    )
    return _BlockingSentinelPool(  # type: ignore[no-untyped-call]
        target.sentinel.master_name,
        sentinels,
        max_connections=max_connections,
        timeout=timeout_s,
        db=target.db,
        **credentials,
        **tls,
        **connection_kwargs,
    )


async def close_client(client: aioredis.Redis) -> None:
    """Close ``client``, its pool and, for a Sentinel-managed master, the connections to the sentinels."""
    pool = client.connection_pool
    await client.aclose()
    if isinstance(pool, SentinelConnectionPool):
        await pool.sentinel_manager.aclose()
