"""Bad set-up of the Kubernetes test environment is explained in one message, not a stack trace."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.k8s import cluster_assets
from tether_devenv import assets
from tether_devenv.assets import AssetsMissing, cache_problem, expected_manifest, locate
from tether_devenv.build import BuildError, build

TETHER = Path(sys.executable).parent / "tether"


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TETHER_CACHE_DIR", str(tmp_path / "cache"))
    for name in assets.COMPONENTS:
        monkeypatch.delenv("TEST_ASSET_" + name.upper().replace("-", "_"), raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    return tmp_path / "cache"


def test_missing_go_toolchain_says_what_to_install(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(empty_cache))
    with pytest.raises(BuildError, match=r"Go toolchain is not installed.*install it"):
        build(progress=lambda _: None)


def test_stale_cache_is_detected_and_explained(empty_cache: Path) -> None:
    directory = assets.cache_dir()
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps(dict(expected_manifest(), kubernetes="1.20.0")))
    problem = cache_problem()
    assert problem is not None and "stale cache" in problem and "1.20.0" in problem
    with pytest.raises(AssetsMissing, match=r"stale cache.*tether dev cluster build"):
        locate()


def test_cache_with_missing_binary_is_stale(empty_cache: Path) -> None:
    directory = assets.cache_dir()
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps(expected_manifest()))
    assert "etcd is missing" in (cache_problem() or "")


def test_envtest_variables_take_precedence(empty_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "assets"
    bin_dir.mkdir()
    for name in assets.COMPONENTS:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    stages = assets.cache_dir() / "stages"
    for stage in assets.KWOK_STAGE_FILES:
        (stages / stage).parent.mkdir(parents=True, exist_ok=True)
        (stages / stage).write_text("")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(bin_dir))
    monkeypatch.setenv("TEST_ASSET_ETCD", "/bin/true")
    found = locate()
    assert found["kube-apiserver"] == bin_dir / "kube-apiserver"
    assert found["etcd"] == Path("/bin/true")


def test_cli_reports_missing_binaries_without_traceback(empty_cache: Path, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TETHER_CACHE_DIR": str(empty_cache), "HOME": str(tmp_path)}
    result = subprocess.run(
        [str(TETHER), "dev", "cluster", "build"], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 1
    assert "error:" in result.stderr and "Go toolchain is not installed" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_reports_port_in_use_without_traceback(tmp_path: Path) -> None:
    cluster_assets()  # the port check comes after the binaries are found
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [str(TETHER), "dev", "cluster", "up", "--dir", str(tmp_path / "c"), "--api-port", str(port)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert result.returncode == 1
    assert f"port 127.0.0.1:{port} for kube-apiserver is already in use" in result.stderr
    assert "Traceback" not in result.stderr
