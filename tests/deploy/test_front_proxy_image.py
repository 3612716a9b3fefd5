"""The front proxy's image (HAProxy before kas' agent listener): reproducible, non-root, shell-less, and it runs
the configuration the ``tether`` chart renders, as uid 65532 on a read-only root without capabilities.

Built (or reused from ``~/.cache/tether/images``) by ``python -m tether.devenv.images front-proxy``, unpacked by
umoci and run with runc, as ``tests/deploy/test_images.py`` does for agentk.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.deploy.test_charts import SERVER, named, render
from tests.deploy.test_images import _image_config, _run, _runc, _runc_args
from tether.devenv.images import BASE_ENV, FRONT_PROXY_CONFIG, IMAGES, UID, BuiltImage
from tether.devenv.process import free_port, tcp_open

SPEC = IMAGES["front-proxy"]


def _build(*args: str) -> BuiltImage:
    result = _run([sys.executable, "-m", "tether.devenv.images", "--json", *args, "front-proxy"])
    assert result.returncode == 0, result.stderr
    fields = json.loads(result.stdout)
    return BuiltImage(**{**fields, "archive": Path(fields["archive"])})


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    return _build()


@pytest.fixture(scope="module")
def bundle(image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("front-proxy-image")
    with tarfile.open(image.archive) as archive:
        archive.extractall(work / "layout", filter="data")
    result = _run(["umoci", "unpack", "--image", f"{work / 'layout'}:{image.reference}", str(work / "bundle")])
    assert result.returncode == 0, result.stderr
    return work / "bundle"


def _pod_mounts(tmp_path: Path, *values: str) -> dict[str, str]:
    """What a pod of the chart mounts: the rendered haproxy.cfg where the image reads it, and the kubelet's
    /etc/resolv.conf (HAProxy's ``resolvers default``, which re-resolves kas' Service name, is made from it)."""
    docs = render(SERVER, *values)
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "haproxy.cfg").write_text(named(docs, "ConfigMap", "t-tether-front-proxy")["data"]["haproxy.cfg"])
    directory.chmod(0o755)
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    return {str(directory): "/etc/tether/front-proxy", str(tmp_path / "resolv.conf"): "/etc/resolv.conf"}


def test_the_image_runs_haproxy_as_65532_with_its_configuration_path(image: BuiltImage) -> None:
    config = _image_config(image)
    assert config["config"]["User"] == f"{UID}:{UID}"
    assert (
        config["config"]["Entrypoint"]
        == list(SPEC.entrypoint)
        == ["/usr/sbin/haproxy", "-db", "-f", FRONT_PROXY_CONFIG]
    )
    assert config["config"]["Env"] == [f"{k}={v}" for k, v in BASE_ENV.items()], "no Python in this image"
    assert config["config"]["Labels"]["org.opencontainers.image.title"] == "tether-front-proxy"
    assert not config.get("history"), "history entries carry build times"
    with tarfile.open(image.archive) as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == SPEC.reference
    assert SPEC.reference.startswith("localhost/tether/front-proxy:")


def test_the_image_has_no_shell_package_manager_or_python(bundle: Path) -> None:
    rootfs = bundle / "rootfs"
    for tool in ("sh", "bash", "dash", "apt", "dpkg", "perl", "python3", "gcc", "tar", "ls"):
        for directory in ("bin", "usr/bin", "sbin", "usr/sbin", "usr/local/bin"):
            assert not (rootfs / directory / tool).exists(), f"/{directory}/{tool} is in the image"
    assert (rootfs / "usr/sbin/haproxy").is_file()
    assert {p.lstat().st_uid for p in rootfs.rglob("*")} == {0}


def test_rebuilding_gives_the_same_digest(image: BuiltImage) -> None:
    again = _build("--force")
    assert not again.cached
    assert again.digest == image.digest


def test_haproxy_in_the_image_accepts_the_charts_configuration(bundle: Path, tmp_path: Path) -> None:
    """``haproxy -c`` in the image, on a read-only root as uid 65532 (kas' Service name does not resolve here)."""
    check = ["/usr/sbin/haproxy", "-c", "-f", FRONT_PROXY_CONFIG]
    command, run_bundle = _runc_args(bundle, check, tmp_path, mounts=_pod_mounts(tmp_path))
    result = _run(command, cwd=run_bundle)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout


def test_the_image_serves_the_charts_configuration(bundle: Path, tmp_path: Path) -> None:
    """The image's own entrypoint listens with the chart's configuration, even under runc's file-descriptor
    limit of 1024 (below what maxconn 20000 asks: ``no strict-limits``)."""
    port = free_port()
    entrypoint = json.loads((bundle / "config.json").read_text())["process"]["args"]
    mounts = _pod_mounts(tmp_path, "--set", f"frontProxy.port={port}")
    command, run_bundle = _runc_args(bundle, entrypoint, tmp_path, host_network=True, mounts=mounts)
    log = (tmp_path / "haproxy.log").open("w")
    process = subprocess.Popen(command, cwd=run_bundle, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None and not tcp_open(port, "127.0.0.1"):
            time.sleep(0.2)
        assert tcp_open(port, "127.0.0.1"), (tmp_path / "haproxy.log").read_text()[-3000:]
    finally:
        runc_root = command[command.index("--root") + 1]
        subprocess.run([command[0], "--root", runc_root, "kill", command[-1], "KILL"], check=False, timeout=30)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        log.close()


def test_haproxy_version_in_the_image(bundle: Path, tmp_path: Path) -> None:
    """Debian 12's HAProxy: >= 2.6, as deploy/front-proxy/haproxy.cfg.template requires."""
    result = _runc(bundle, ["/usr/sbin/haproxy", "-v"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("HAProxy version 2.6.")
