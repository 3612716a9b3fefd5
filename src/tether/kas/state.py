"""Where kas keeps its state: the Redis of the ``redis`` section (kas.md §3.1), or memory without one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tether.kas.errors import KasStartError
from tether.modserver.config import KasConfigBase, sentinel_host_port
from tether.tool.expiring_hash import HashBackend
from tether.tool.memory_backend import MemoryBackend

if TYPE_CHECKING:
    from tether.tool.redis_pool import RedisTarget

__all__ = ["redis_target", "state_backend"]


def state_backend(config: KasConfigBase, target: RedisTarget | None) -> HashBackend:
    """The backend of every tracker: Redis at ``target`` with the section's pool settings, else memory."""
    if target is None or config.redis is None:
        return MemoryBackend()
    from tether.tool.redis_backend import RedisBackend  # noqa: PLC0415 (redis-py only when configured)

    cfg = config.redis
    return RedisBackend.connect(
        target,
        dial_timeout_s=cfg.dial_timeout,
        write_timeout_s=cfg.write_timeout,
        pool_size=cfg.pool_size,
        pool_timeout_s=cfg.pool_timeout,
    )


def _read_password(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise KasStartError(f"{what} {path} cannot be read: {exc.strerror}") from exc


def redis_target(config: KasConfigBase) -> RedisTarget | None:
    """Where this kas' Redis is, from the ``redis`` section (kas.md §3.1); None without one (memory state).

    Raises:
        KasStartError: a password file cannot be read.
    """
    cfg = config.redis
    if cfg is None:
        return None
    from tether.tool.redis_pool import RedisTarget, SentinelMaster, TlsFiles  # noqa: PLC0415 (redis-py when configured)

    password = _read_password(cfg.password_file, "redis.password_file") if cfg.password_file else None
    tls = None
    if cfg.tls.enabled:
        tls = TlsFiles(cfg.tls.ca_certificate_file, cfg.tls.certificate_file, cfg.tls.key_file)
    if cfg.sentinel is not None:
        sentinel_password = None
        if cfg.sentinel.sentinel_password_file is not None:
            sentinel_password = _read_password(
                cfg.sentinel.sentinel_password_file, "redis.sentinel.sentinel_password_file"
            )
        master = SentinelMaster(
            cfg.sentinel.master_name,
            tuple(sentinel_host_port(address) for address in cfg.sentinel.addresses),
            sentinel_password,
        )
        return RedisTarget(sentinel=master, username=cfg.username, password=password, db=cfg.database_index, tls=tls)
    assert cfg.server is not None
    if cfg.network == "unix":
        url = f"unix://{cfg.server.address}?db={cfg.database_index}"
    else:
        url = f"{'rediss' if tls else 'redis'}://{cfg.server.address}/{cfg.database_index}"
    return RedisTarget(url=url, username=cfg.username, password=password, tls=tls)
