"""Bad set-up is explained (what happened, the server's own output, what to do), not stack-traced."""

from __future__ import annotations

import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether_devenv.postgres_server import PostgresServer
from tether_devenv.process import EnvironmentProblem, ManagedProcess, PortInUse, ProcessFailed, pid_alive
from tether_devenv.redis_server import RedisServer


@pytest.fixture
def bound_port() -> Iterator[int]:
    """A loopback port held by a listening socket of our own for the duration of the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def sh() -> str:
    path = shutil.which("sh")
    assert path is not None
    return path


def test_redis_on_a_busy_port_raises_port_in_use(tmp_path: Path, bound_port: int) -> None:
    server = RedisServer(tmp_path, port=bound_port)
    try:
        with pytest.raises(PortInUse) as info:
            server.start()
    finally:
        server.stop()
    assert str(bound_port) in str(info.value)
    assert "redis-server" in str(info.value)
    assert not server.is_running()


def test_postgres_on_a_busy_port_raises_port_in_use(tmp_path: Path, bound_port: int) -> None:
    server = PostgresServer(tmp_path, port=bound_port)
    try:
        with pytest.raises(PortInUse) as info:
            server.start()
    finally:
        server.stop()
    assert str(bound_port) in str(info.value)


def test_missing_redis_binary_says_how_to_install(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, binary=str(tmp_path / "no-such-redis-server"))
    with pytest.raises(EnvironmentProblem, match=r"apt-get install redis-server"):
        server.start()


def test_missing_postgres_binaries_say_how_to_install(tmp_path: Path) -> None:
    server = PostgresServer(tmp_path, bin_dir=tmp_path / "no-such-bin")
    with pytest.raises(EnvironmentProblem, match=r"apt-get install postgresql"):
        server.start()


def test_process_that_exits_reports_its_output_and_status(tmp_path: Path) -> None:
    proc = ManagedProcess("boom", [sh(), "-c", "echo boom-marker >&2; exit 3"], log_path=tmp_path / "boom.log")
    proc.start()
    try:
        with pytest.raises(ProcessFailed) as info:
            proc.wait_ready(lambda: False, timeout=30, what="ready")
    finally:
        proc.stop()
    message = str(info.value)
    assert "boom-marker" in message
    assert "status 3" in message
    assert "boom" in message


def test_readiness_timeout_is_reported_and_stop_ends_the_process(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    proc = ManagedProcess("sleeper", [sleep, "30"], log_path=tmp_path / "sleeper.log")
    proc.start()
    pid = proc.pid
    try:
        with pytest.raises(ProcessFailed) as info:
            proc.wait_ready(lambda: False, timeout=0.5, what="ready")
    finally:
        proc.stop()
    assert "did not become ready" in str(info.value)
    assert "sleeper" in str(info.value)
    assert not pid_alive(pid)


def test_a_probe_answered_by_another_process_on_the_port_is_not_ready(tmp_path: Path, bound_port: int) -> None:
    # The port was picked for the process but another one (here: this test) holds it; the probe passes anyway.
    sleep = shutil.which("sleep")
    assert sleep is not None
    proc = ManagedProcess("sleeper", [sleep, "30"], log_path=tmp_path / "sleeper.log")
    proc.start()
    try:
        with pytest.raises(ProcessFailed, match="did not become ready"):
            proc.wait_ready(lambda: True, timeout=0.5, what="ready", port=bound_port)
    finally:
        proc.stop()


def test_a_probe_on_a_port_the_process_listens_on_is_ready(tmp_path: Path) -> None:
    script = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); "
    script += "print(s.getsockname()[1], flush=True); time.sleep(30)"
    log = tmp_path / "listener.log"
    proc = ManagedProcess("listener", [sys.executable, "-c", script], log_path=log)
    proc.start()
    try:
        proc.wait_ready(lambda: log.read_text().strip() != "", timeout=30, what="listening")
        proc.wait_ready(lambda: True, timeout=30, what="ready", port=int(log.read_text()))
    finally:
        proc.stop()
