"""Supervision of one local server process: start, readiness wait, log tail on failure, stop by pid.

Every server the test environment starts (redis-server, postgres, etcd, kube-*, kwok) goes through
:class:`ManagedProcess`, so that a failure always reports the binary's own log tail instead of a
Python stack trace, and teardown only ever signals the recorded pid, never a process found by name.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

LOG_TAIL_LINES = 25


class EnvironmentProblem(RuntimeError):
    """A set-up problem a person must fix; the message says what happened and what to do."""


class ProcessFailed(EnvironmentProblem):
    """A server exited or never became ready; the message includes the tail of its log."""


class PortInUse(EnvironmentProblem):
    """A requested port is already bound by another process."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0, then close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports on ``host`` that were free a moment ago.

    All are held bound until every one is chosen: calling :func:`free_port` repeatedly may get one port twice.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def ensure_port_free(port: int, host: str = "127.0.0.1", owner: str = "server") -> None:
    """Raise :class:`PortInUse` naming ``owner`` when ``host:port`` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so a port held only by closed (TIME_WAIT) connections is free for them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {host}:{port} for {owner} is already in use ({exc.strerror}); stop whatever listens "
                f"there (e.g. `ss -ltnp 'sport = :{port}'`) or choose another port"
            ) from exc


def tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    """Return True when something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of the log file at ``path`` (empty string if unreadable)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """One supervised server process.

    Attributes:
        name: short name used in messages (``etcd``, ``redis-server``...).
        args: argv; ``args[0]`` is the binary path.
        log_path: stdout and stderr of the process go here.
        env: environment, or None to inherit.
        user: run as this system user (e.g. ``postgres``, because initdb refuses root); root only.
        cwd: working directory.
    """

    name: str
    args: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    user: str | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """The pid of the started process; raises RuntimeError before :meth:`start`."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.popen.pid

    def start(self) -> None:
        """Start the process in its own session, appending output to :attr:`log_path`.

        Raises:
            ProcessFailed: the binary cannot be executed.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self.popen = subprocess.Popen(
                    list(self.args),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    cwd=self.cwd,
                    user=self.user,
                    # Drop root's groups too, not only its uid, when running as another user.
                    group=pwd.getpwnam(self.user).pw_gid if self.user else None,
                    extra_groups=[] if self.user else None,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ProcessFailed(f"cannot run {self.name} ({self.args[0]}): {exc}") from exc

    def failure(self, what: str) -> ProcessFailed:
        """Build a :class:`ProcessFailed` for ``what`` that carries the log tail."""
        tail = log_tail(self.log_path)
        shown = "\n    ".join(tail.splitlines()) or "(empty log)"
        return ProcessFailed(f"{self.name} {what}. Last lines of {self.log_path}:\n    {shown}")

    def check_alive(self) -> None:
        """Raise :class:`ProcessFailed` (with the log tail) when the process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise self.failure(f"exited with status {self.popen.returncode}")

    def listens_on(self, port: int) -> bool:
        """Return True when this process, or one of its children, holds a listening TCP socket on ``port``.

        False too when the processes cannot be inspected (already gone, or another user's without the right to
        read their sockets): readiness is then not proven.
        """
        try:
            root = psutil.Process(self.pid)
            processes = [root, *root.children(recursive=True)]
            return any(
                conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
                for process in processes
                for conn in process.net_connections("tcp")
            )
        except psutil.Error:
            return False

    def wait_ready(
        self, probe: Callable[[], bool], timeout: float, what: str = "ready", port: int | None = None
    ) -> None:
        """Poll ``probe`` every 0.1 s until it returns True.

        Args:
            probe: readiness check; exceptions count as not ready.
            timeout: seconds before giving up.
            what: wording for the error message.
            port: the TCP port ``probe`` talks to, when this process should listen there. A probe that passes
                counts only while this process holds that port: ports picked as free a moment ago can be taken
                by another test's server (seen in CI: a kas that could not start looked ready, because another
                kas answered on the observability port picked for it).

        Raises:
            ProcessFailed: the process exited, or ``timeout`` passed; both show the log tail.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            with contextlib.suppress(Exception):
                if probe() and (port is None or self.listens_on(port)):
                    return
            if time.monotonic() > deadline:
                raise self.failure(f"did not become {what} within {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the recorded pid (and its process group), SIGKILL after ``timeout`` seconds."""
        if self.popen is None or self.popen.poll() is not None:
            return
        stop_pid(self.popen.pid, timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1)


class SupervisedServer:
    """Shared behaviour of a server class that keeps its :class:`ManagedProcess` in ``_process``.

    Subclasses implement ``start() -> Self`` and ``stop(timeout)``; this adds :meth:`is_running` and the
    context-manager form (``with RedisServer(dir) as server: ...``).
    """

    _process: ManagedProcess | None

    def start(self) -> Self:
        """Start the server (implemented by subclasses)."""
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by pid (implemented by subclasses)."""
        raise NotImplementedError

    def is_running(self) -> bool:
        """Return True when the server process was started and has not exited."""
        if self._process is None:
            return False
        with contextlib.suppress(ProcessFailed):
            self._process.check_alive()
            return True
        return False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """Terminate process ``pid`` and its process group: SIGTERM, then SIGKILL after ``timeout`` s.

    Only the given pid's group is signalled; processes are never looked up by name.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Return True when ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
