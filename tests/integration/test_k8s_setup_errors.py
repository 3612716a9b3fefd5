"""A real control-plane binary that fails to start is reported with the tail of its own log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.k8s import cluster_assets
from tether_devenv.cluster import LocalCluster
from tether_devenv.process import ProcessFailed, pid_alive

pytestmark = pytest.mark.k8s


def test_failing_apiserver_shows_its_log_tail(tmp_path: Path) -> None:
    found = cluster_assets()
    lines: list[str] = []
    cluster = LocalCluster(
        tmp_path / "c", assets=found, progress=lines.append, extra_apiserver_args=("--no-such-flag=1",)
    )
    with pytest.raises(ProcessFailed) as failure:
        cluster.start()
    message = str(failure.value)
    assert "kube-apiserver exited with status" in message
    assert "unknown flag: --no-such-flag" in message
    assert "kube-apiserver.log" in message
    # etcd had started; the failed start must not leave it running.
    etcd_pid = int(re.search(r"etcd healthy .*pid (\d+)", "\n".join(lines))[1])  # type: ignore[index]
    assert not pid_alive(etcd_pid)
