"""A private, throw-away ``redis-server`` for tests and local runs.

The server listens on loopback only, keeps nothing on disk (``--save '' --appendonly no``) and runs in the
foreground under :class:`~tether_devenv.process.ManagedProcess`, so start-up problems are reported with the
server's own log tail and teardown signals only the recorded pid.
"""

from __future__ import annotations

import functools
import shutil
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tether_devenv.process import (
    EnvironmentProblem,
    ManagedProcess,
    ProcessFailed,
    SupervisedServer,
    ensure_port_free,
    free_port,
)

HOST = "127.0.0.1"
INSTALL_HINT = "install it with `apt-get install redis-server`"

# A port chosen by free_port() can be taken by someone else before redis binds it; retry a few times then.
_AUTO_PORT_ATTEMPTS = 3


def find_redis_server(binary: str | None = None) -> str:
    """Return the path of the ``redis-server`` executable.

    Args:
        binary: explicit path or command name; None means ``redis-server`` looked up on ``PATH``.

    Raises:
        EnvironmentProblem: the binary does not exist or is not executable; the message says how to install it.
    """
    wanted = binary or "redis-server"
    found = shutil.which(wanted)
    if found is None:
        raise EnvironmentProblem(f"redis-server not found ({wanted!r} is not an executable on PATH); {INSTALL_HINT}")
    return found


@dataclass(frozen=True)
class RedisServerTls:
    """TLS of a :class:`RedisServer`: it then listens with TLS only (``--tls-port``, no plain port).

    Attributes:
        certificate_file / key_file: the server's certificate (SAN 127.0.0.1) and key, PEM.
        ca_certificate_file: the CA that signed it, and the clients' certificates.
        auth_clients: whether clients must present a certificate signed by that CA (``--tls-auth-clients``).
    """

    certificate_file: Path
    key_file: Path
    ca_certificate_file: Path
    auth_clients: bool = True

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting the CA, presenting the server's own certificate (it is valid for clients too)."""
        context = ssl.create_default_context(cafile=str(self.ca_certificate_file))
        context.load_cert_chain(str(self.certificate_file), str(self.key_file))
        return context

    def args(self, port: int) -> list[str]:
        """The ``redis-server`` arguments that serve TLS on ``port``."""
        return [
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(self.certificate_file),
            "--tls-key-file",
            str(self.key_file),
            "--tls-ca-cert-file",
            str(self.ca_certificate_file),
            "--tls-auth-clients",
            "yes" if self.auth_clients else "no",
        ]


def redis_ping(
    port: int,
    host: str = HOST,
    timeout: float = 1.0,
    password: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> bool:
    """Send a RESP ``PING`` (after ``AUTH password`` when given) to ``host:port``; True when it answers ``+PONG``.

    Args:
        port: TCP port of the server.
        host: address of the server.
        timeout: socket timeout in seconds for connect and read.
        password: the server's ``requirepass``, or None.
        tls: the client context for a server that speaks TLS, or None.

    Returns:
        False on any connection error or other reply (e.g. ``-LOADING`` while the server starts).
    """
    request, expected = b"*1\r\n$4\r\nPING\r\n", b"+PONG"
    if password is not None:
        secret = password.encode()
        request = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(secret), secret) + request
        expected = b"+OK\r\n+PONG"
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
            sock.sendall(request)
            reply = b""
            while len(reply) < len(expected) and (chunk := sock.recv(64)):
                reply += chunk
            return reply.startswith(expected)
    except OSError:
        return False


@dataclass
class RedisServer(SupervisedServer):
    """A private ``redis-server`` process bound to ``127.0.0.1``.

    Use :meth:`start` / :meth:`stop`, or the object as a context manager::

        with RedisServer(tmp_dir) as server:
            client = redis.Redis.from_url(server.url)

    Attributes:
        base_dir: directory for the working dir and the log file ``redis-server.log``; created if missing.
        port: TCP port to listen on; None picks a free port at :meth:`start`. After start it holds the port used.
        binary: path or name of the ``redis-server`` executable; None means look it up on ``PATH``.
        startup_timeout: seconds to wait for ``PING`` to be answered.
        password: ``requirepass`` (and ``masterauth``, for a replica) or None.
        replica_of: port of a master on ``127.0.0.1`` to replicate (``--replicaof``), or None for a master.
        tls: serve TLS only (:class:`RedisServerTls`), or None for plain TCP.
    """

    base_dir: Path
    port: int | None = None
    binary: str | None = None
    startup_timeout: float = 15.0
    password: str | None = None
    replica_of: int | None = None
    tls: RedisServerTls | None = None
    _process: ManagedProcess | None = field(default=None, init=False, repr=False)

    @property
    def log_path(self) -> Path:
        """The file receiving the server's stdout and stderr (Redis logs to stdout when no logfile is set)."""
        return self.base_dir / "redis-server.log"

    @property
    def pid(self) -> int:
        """Pid of the running server; raises RuntimeError before :meth:`start`."""
        if self._process is None:
            raise RuntimeError("redis-server was not started")
        return self._process.pid

    @property
    def url(self) -> str:
        """Connection URL of database 0, ``redis://127.0.0.1:<port>/0``; raises RuntimeError before start."""
        return self.url_for_db(0)

    def url_for_db(self, db: int) -> str:
        """Return the URL of logical database ``db`` (0..15); raises RuntimeError before :meth:`start`."""
        if self._process is None or self.port is None:
            raise RuntimeError("redis-server was not started")
        return f"{'rediss' if self.tls else 'redis'}://{HOST}:{self.port}/{db}"

    def start(self) -> Self:
        """Start the server and wait until it answers ``PING``.

        Returns:
            self, for chaining.

        Raises:
            PortInUse: an explicitly requested :attr:`port` is already bound.
            EnvironmentProblem: ``redis-server`` is not installed.
            ProcessFailed: the server exited or did not answer within :attr:`startup_timeout` seconds;
                the message carries the tail of :attr:`log_path`.
        """
        if self._process is not None:
            raise RuntimeError("redis-server already started")
        fixed_port = self.port
        if fixed_port is not None:
            ensure_port_free(fixed_port, HOST, owner="redis-server")
        executable = find_redis_server(self.binary)
        self.base_dir.mkdir(parents=True, exist_ok=True)

        attempts = 1 if fixed_port is not None else _AUTO_PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = fixed_port if fixed_port is not None else free_port(HOST)
            self.port = port
            self._process = ManagedProcess(
                name="redis-server",
                args=self._args(executable, port),
                log_path=self.log_path,
                cwd=self.base_dir,
            )
            try:
                self._process.start()
                self._process.wait_ready(
                    functools.partial(
                        redis_ping,
                        port,
                        password=self.password,
                        tls=self.tls.client_context() if self.tls else None,
                    ),
                    self.startup_timeout,
                    "ready (PING)",
                )
            except ProcessFailed as exc:
                self.stop()
                if attempt < attempts and "Address already in use" in str(exc):
                    continue
                self.port = fixed_port
                raise
            return self
        raise AssertionError("unreachable")  # the loop either returns or raises

    def _args(self, executable: str, port: int) -> list[str]:
        return [
            executable,
            *(self.tls.args(port) if self.tls else ("--port", str(port))),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.base_dir),
            # Empty logfile means stdout, which ManagedProcess captures, so early config errors land in the log too.
            "--logfile",
            "",
            *(("--requirepass", self.password, "--masterauth", self.password) if self.password else ()),
            *(("--replicaof", HOST, str(self.replica_of)) if self.replica_of else ()),
        ]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid (SIGTERM, SIGKILL after ``timeout`` seconds); no-op if not running."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(timeout)
