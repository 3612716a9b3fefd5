"""A private, throw-away ``redis-sentinel`` for tests and benchmarks (Debian's ``redis-sentinel`` package).

A sentinel rewrites its configuration file as it learns the other sentinels and replicas, so each one gets a
file of its own under its ``base_dir``. It listens on loopback only and runs in the foreground under
:class:`~tether_devenv.process.ManagedProcess` (its log tail in every start-up error, teardown by pid).
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tether_devenv.process import EnvironmentProblem, ManagedProcess, SupervisedServer, free_port
from tether_devenv.redis_server import HOST, redis_ping

INSTALL_HINT = "install it with `apt-get install redis-sentinel`"


@dataclass
class RedisSentinel(SupervisedServer):
    """One ``redis-sentinel`` watching the master ``master_name`` at ``127.0.0.1:master_port``.

    Attributes:
        base_dir: its directory: configuration file ``sentinel.conf`` and log ``redis-sentinel.log``.
        master_port: the monitored master's port on ``127.0.0.1``.
        master_name: the name clients ask for (``redis.sentinel.master_name``).
        quorum: sentinels that must agree that the master is down before a failover.
        down_after_ms: milliseconds without a valid reply before this sentinel thinks the master is down.
        failover_timeout_ms: ``sentinel failover-timeout`` (also the pause before a failed failover is retried).
        master_password: the data servers' ``requirepass`` (``sentinel auth-pass``), or None.
        password: this sentinel's own ``requirepass`` (also used towards the other sentinels), or None.
        port: TCP port; None picks a free one at :meth:`start`.
        startup_timeout: seconds to wait for ``PING`` to be answered.
    """

    base_dir: Path
    master_port: int
    master_name: str = "tether"
    quorum: int = 2
    down_after_ms: int = 1000
    failover_timeout_ms: int = 10_000
    master_password: str | None = None
    password: str | None = None
    port: int | None = None
    startup_timeout: float = 15.0
    _process: ManagedProcess | None = field(default=None, init=False, repr=False)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``; raises RuntimeError before :meth:`start`."""
        if self.port is None or self._process is None:
            raise RuntimeError("redis-sentinel was not started")
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """Pid of the running sentinel; raises RuntimeError before :meth:`start`."""
        if self._process is None:
            raise RuntimeError("redis-sentinel was not started")
        return self._process.pid

    def _config(self, port: int) -> str:
        name = self.master_name
        lines = [
            f"port {port}",
            f"bind {HOST}",
            "daemonize no",
            'logfile ""',
            f"dir {self.base_dir}",
            f"sentinel monitor {name} {HOST} {self.master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self.master_password:
            lines.append(f"sentinel auth-pass {name} {self.master_password}")
        if self.password:
            lines += [f"requirepass {self.password}", f"sentinel sentinel-pass {self.password}"]
        return "\n".join(lines) + "\n"

    def start(self) -> Self:
        """Write the configuration, start the sentinel and wait until it answers ``PING``.

        Raises:
            EnvironmentProblem: ``redis-sentinel`` is not installed.
            ProcessFailed: it exited or did not answer within :attr:`startup_timeout`; with its log tail.
        """
        if self._process is not None:
            raise RuntimeError("redis-sentinel already started")
        executable = shutil.which("redis-sentinel")
        if executable is None:
            raise EnvironmentProblem(f"redis-sentinel not found on PATH; {INSTALL_HINT}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        port = self.port if self.port is not None else free_port(HOST)
        self.port = port
        config = self.base_dir / "sentinel.conf"
        config.write_text(self._config(port))
        self._process = ManagedProcess(
            name="redis-sentinel",
            args=[executable, str(config)],
            log_path=self.base_dir / "redis-sentinel.log",
            cwd=self.base_dir,
        )
        self._process.start()
        try:
            self._process.wait_ready(
                functools.partial(redis_ping, port, password=self.password), self.startup_timeout, "ready (PING)"
            )
        except Exception:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the sentinel by its pid (SIGTERM, SIGKILL after ``timeout`` seconds); no-op if not running."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(timeout)
