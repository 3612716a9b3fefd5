"""A private, throw-away PostgreSQL cluster for tests and local runs.

A fresh cluster is made with ``initdb`` (trust authentication, superuser ``postgres``) and served by a
foreground ``postgres`` under :class:`~tether_devenv.process.ManagedProcess`, listening on loopback only with
durability switched off (``fsync``, ``synchronous_commit``, ``full_page_writes``) because the data is disposable.

``initdb`` and ``postgres`` refuse to run as root, so when we are root both run as the ``postgres`` system user.
The cluster then lives in a short directory of its own under the system temp dir (owned by ``postgres``):
pytest's temp dirs are mode 0700 under root, hence unreachable for that user, and the Unix socket path must
stay under about 100 bytes. Logs stay in the caller's ``base_dir``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
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
    tcp_open,
)

HOST = "127.0.0.1"
SUPERUSER = "postgres"
SYSTEM_USER = "postgres"
INSTALL_HINT = "install it with `apt-get install postgresql`"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
REQUIRED_BINARIES = ("initdb", "postgres", "pg_isready", "createdb", "dropdb")

_AUTO_PORT_ATTEMPTS = 3
_DB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_postgres_bin_dir(bin_dir: Path | None = None) -> Path:
    """Return the directory holding ``initdb``, ``postgres``, ``pg_isready``, ``createdb`` and ``dropdb``.

    Args:
        bin_dir: explicit directory; None means the newest ``/usr/lib/postgresql/<version>/bin`` (Debian layout)
            that has the binaries, else the directory of ``initdb`` on ``PATH``.

    Raises:
        EnvironmentProblem: no such directory has all the binaries; the message says how to install them.
    """

    def complete(candidate: Path) -> bool:
        return all(os.access(candidate / name, os.X_OK) for name in REQUIRED_BINARIES)

    if bin_dir is not None:
        if complete(bin_dir):
            return bin_dir
        missing = [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]
        raise EnvironmentProblem(f"PostgreSQL binaries {missing} not found in {bin_dir}; {INSTALL_HINT}")

    # Debian keeps the server binaries off PATH, one directory per major version; prefer the newest.
    for candidate in sorted(DEBIAN_ROOT.glob("*/bin"), key=_version_key, reverse=True):
        if complete(candidate):
            return candidate
    initdb = shutil.which("initdb")
    if initdb is not None and complete(Path(initdb).parent):
        return Path(initdb).parent
    raise EnvironmentProblem(
        f"PostgreSQL server binaries (initdb, postgres) not found in {DEBIAN_ROOT}/*/bin nor on PATH; {INSTALL_HINT}"
    )


def _run_as_user() -> str | None:
    """Return the system user the server must run as: ``postgres`` when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError as exc:
        raise EnvironmentProblem(
            f"running as root, but there is no {SYSTEM_USER!r} system user to run PostgreSQL as "
            f"(initdb refuses root); {INSTALL_HINT}, which creates it, or run as a normal user"
        ) from exc
    return SYSTEM_USER


@dataclass
class PostgresServer(SupervisedServer):
    """A private PostgreSQL server on ``127.0.0.1`` with a fresh cluster (superuser ``postgres``, trust auth).

    Use :meth:`start` / :meth:`stop`, or the object as a context manager::

        with PostgresServer(tmp_dir) as server:
            engine = create_async_engine(server.sqlalchemy_url)

    Attributes:
        base_dir: directory for the log files ``initdb.log`` and ``postgres.log``; created if missing.
        port: TCP port to listen on; None picks a free port at :meth:`start`. After start it holds the port used.
        bin_dir: directory of the PostgreSQL binaries; None means :func:`find_postgres_bin_dir` decides.
        startup_timeout: seconds to wait for ``initdb`` to finish and, separately, for the server to accept
            connections.
    """

    base_dir: Path
    port: int | None = None
    bin_dir: Path | None = None
    startup_timeout: float = 60.0
    _process: ManagedProcess | None = field(default=None, init=False, repr=False)
    _cluster_dir: Path | None = field(default=None, init=False, repr=False)
    _bin: Path | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int:
        """Pid of the postmaster; raises RuntimeError before :meth:`start`."""
        if self._process is None:
            raise RuntimeError("postgres was not started")
        return self._process.pid

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (removed again by :meth:`stop`); raises RuntimeError before start."""
        return self._cluster().joinpath("data")

    @property
    def dsn(self) -> str:
        """The libpq URL of the ``postgres`` database: ``postgresql://postgres@127.0.0.1:<port>/postgres``."""
        return self.dsn_for("postgres")

    @property
    def sqlalchemy_url(self) -> str:
        """SQLAlchemy async URL of the ``postgres`` database: ``postgresql+asyncpg://postgres@127.0.0.1:<port>/postgres``."""
        return self.sqlalchemy_url_for("postgres")

    def dsn_for(self, database: str) -> str:
        """Return the libpq URL of ``database``; raises RuntimeError before :meth:`start`."""
        return f"postgresql://{SUPERUSER}@{HOST}:{self._port()}/{database}"

    def sqlalchemy_url_for(self, database: str) -> str:
        """Return the ``postgresql+asyncpg://`` URL of ``database``; raises RuntimeError before :meth:`start`."""
        return f"postgresql+asyncpg://{SUPERUSER}@{HOST}:{self._port()}/{database}"

    def _port(self) -> int:
        if self._process is None or self.port is None:
            raise RuntimeError("postgres was not started")
        return self.port

    def _cluster(self) -> Path:
        if self._cluster_dir is None:
            raise RuntimeError("postgres was not started")
        return self._cluster_dir

    def _binary(self, name: str) -> str:
        if self._bin is None:
            raise RuntimeError("postgres was not started")
        return str(self._bin / name)

    def start(self) -> Self:
        """Create the cluster with ``initdb``, start ``postgres`` and wait until ``pg_isready`` reports it ready.

        Returns:
            self, for chaining.

        Raises:
            PortInUse: an explicitly requested :attr:`port` is already bound.
            EnvironmentProblem: the PostgreSQL binaries (or, as root, the ``postgres`` user) are missing.
            ProcessFailed: ``initdb`` failed, or the server exited or was not ready within
                :attr:`startup_timeout` seconds; the message carries the tail of the relevant log.
        """
        if self._process is not None:
            raise RuntimeError("postgres already started")
        fixed_port = self.port
        if fixed_port is not None:
            ensure_port_free(fixed_port, HOST, owner="postgres")
        self._bin = find_postgres_bin_dir(self.bin_dir)
        user = _run_as_user()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._init_cluster(user)
            self._serve(user, fixed_port)
        except BaseException:
            self.stop()
            self.port = fixed_port
            raise
        return self

    def _init_cluster(self, user: str | None) -> None:
        cluster = Path(tempfile.mkdtemp(prefix="tether-pg-"))
        self._cluster_dir = cluster
        # 0755 so the server user can enter it; the data dir inside is created 0700 by initdb itself.
        cluster.chmod(0o755)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(cluster, entry.pw_uid, entry.pw_gid)
        initdb = ManagedProcess(
            name="initdb",
            args=[
                self._binary("initdb"),
                "-D",
                str(self.data_dir),
                "-A",
                "trust",
                "-U",
                SUPERUSER,
                "--no-sync",
                "-E",
                "UTF8",
                # C collation works with any encoding and does not depend on which locales the machine has.
                "--locale=C",
            ],
            log_path=self.base_dir / "initdb.log",
            user=user,
            # The server user may not be able to enter our cwd; tools warn or fail then.
            cwd=cluster,
        )
        initdb.start()
        if initdb.popen is None:
            raise RuntimeError("ManagedProcess.start() did not record the initdb process")
        try:
            status = initdb.popen.wait(timeout=self.startup_timeout)
        except subprocess.TimeoutExpired:
            initdb.stop()
            raise initdb.failure(f"did not finish within {self.startup_timeout:.0f}s") from None
        if status != 0:
            raise initdb.failure(f"exited with status {status}")

    def _serve(self, user: str | None, fixed_port: int | None) -> None:
        attempts = 1 if fixed_port is not None else _AUTO_PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = fixed_port if fixed_port is not None else free_port(HOST)
            self.port = port
            self._process = ManagedProcess(
                name="postgres",
                args=[
                    self._binary("postgres"),
                    "-D",
                    str(self.data_dir),
                    "-p",
                    str(port),
                    "-k",
                    str(self._cluster()),
                    "-c",
                    f"listen_addresses={HOST}",
                    # Durability is pointless for a throw-away cluster and costs most of the test time.
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ],
                log_path=self.base_dir / "postgres.log",
                user=user,
                cwd=self._cluster(),
            )
            try:
                self._process.start()
                self._process.wait_ready(
                    functools.partial(self._ready, port), self.startup_timeout, what="ready (pg_isready)"
                )
            except ProcessFailed as exc:
                self._stop_server()
                if attempt < attempts and "Address already in use" in str(exc):
                    continue
                raise
            return

    def _ready(self, port: int) -> bool:
        if not tcp_open(port, HOST):
            return False
        # pg_isready exits 0 only once the server accepts connections (not while starting up or recovering).
        result = subprocess.run(
            [
                self._binary("pg_isready"),
                "-q",
                "-h",
                HOST,
                "-p",
                str(port),
                "-U",
                SUPERUSER,
                "-d",
                "postgres",
                "-t",
                "2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
        return result.returncode == 0

    def create_database(self, name: str, timeout: float = 30.0) -> str:
        """Create database ``name`` (owner ``postgres``, UTF8) and return its libpq URL.

        Args:
            name: a plain identifier, ``[A-Za-z_][A-Za-z0-9_]*``, at most 63 characters.
            timeout: seconds to allow ``createdb``.

        Raises:
            ValueError: ``name`` is not a plain identifier.
            RuntimeError: the server was not started.
            ProcessFailed: ``createdb`` failed (e.g. the database exists); the message carries its stderr.
        """
        self._client_tool("createdb", name, timeout)
        return self.dsn_for(name)

    def drop_database(self, name: str, timeout: float = 30.0) -> None:
        """Drop database ``name``, disconnecting its sessions first (``DROP DATABASE ... WITH (FORCE)``).

        Args:
            name: a plain identifier, as for :meth:`create_database`.
            timeout: seconds to allow ``dropdb``.

        Raises:
            ValueError: ``name`` is not a plain identifier.
            RuntimeError: the server was not started.
            ProcessFailed: ``dropdb`` failed (e.g. no such database); the message carries its stderr.
        """
        self._client_tool("dropdb", name, timeout, "--force")

    def _client_tool(self, tool: str, name: str, timeout: float, *extra: str) -> None:
        if not _DB_NAME.fullmatch(name):
            raise ValueError(f"database name {name!r} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, <= 63 chars)")
        # Trust auth over TCP: connecting as database role postgres needs no OS user switch.
        args = [self._binary(tool), "-h", HOST, "-p", str(self._port()), "-U", SUPERUSER, *extra, name]
        try:
            result = subprocess.run(
                args, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False, text=True
            )
        except subprocess.TimeoutExpired as exc:
            raise ProcessFailed(f"{tool} {name} did not finish within {timeout:.0f}s") from exc
        if result.returncode != 0:
            raise ProcessFailed(f"{tool} {name} exited with status {result.returncode}: {result.stderr.strip()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid and delete the cluster directory; no-op if not running.

        Sends SIGINT first (PostgreSQL's "fast" shutdown: disconnect clients, checkpoint, exit) and waits up
        to ``timeout`` seconds, then falls back to SIGTERM/SIGKILL of the process group.
        """
        self._stop_server(timeout)
        cluster, self._cluster_dir = self._cluster_dir, None
        if cluster is not None:
            shutil.rmtree(cluster, ignore_errors=True)

    def _stop_server(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.popen is None:
            return
        if process.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.popen.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=timeout)
        # SIGTERM alone is "smart" shutdown, which waits for clients; only reached if SIGINT did not work.
        process.stop(timeout)
