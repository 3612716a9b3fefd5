"""The front proxy's image (HAProxy before kas' agent listener): reproducible, non-root, shell-less, and it runs
the configuration the ``tether`` chart renders, as uid 65532 on a read-only root without capabilities.

Built (or reused from ``~/.cache/tether/images``) by ``python -m tether_devenv.images front-proxy``, unpacked by
umoci and run with runc, as ``tests/deploy/test_images.py`` does for agentk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.test_charts import SERVER, named, render
from tests.deploy.test_images import _image_config, _run, _runc, _runc_args, build_image, unpack_image
from tests.e2e.test_k8s_proxy import proxy_kubeconfig, run, wait_for
from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tether_devenv.cluster import ClusterInfo
from tether_devenv.images import BASE_ENV, FRONT_PROXY_CONFIG, IMAGES, UID, BuiltImage, _recipe_digest
from tether_devenv.process import free_port, tcp_open

SPEC = IMAGES["front-proxy"]


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    return build_image("front-proxy")


@pytest.fixture(scope="module")
def bundle(image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_image(image, tmp_path_factory.mktemp("front-proxy-image"))


def _pod_mounts(tmp_path: Path, *values: str) -> dict[str, str]:
    """What a pod of the chart mounts: the rendered haproxy.cfg where the image reads it, and the kubelet's
    /etc/resolv.conf and /etc/hosts; here the hosts file resolves kas' Service name ``t-tether-kas`` (HAProxy
    looks it up once at start through the C library, as in a pod through the cluster's DNS)."""
    docs = render(SERVER, *values)
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "haproxy.cfg").write_text(named(docs, "ConfigMap", "t-tether-front-proxy")["data"]["haproxy.cfg"])
    directory.chmod(0o755)
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    (tmp_path / "hosts").write_text("127.0.0.1 localhost t-tether-kas\n")
    mounts = {str(tmp_path / "resolv.conf"): "/etc/resolv.conf", str(tmp_path / "hosts"): "/etc/hosts"}
    return {str(directory): "/etc/tether/front-proxy", **mounts}


@contextlib.contextmanager
def _serving(bundle: Path, tmp_path: Path, port: int, *values: str) -> Iterator[None]:
    """The image's own entrypoint with the chart's configuration (``values`` added), on the host's network."""
    entrypoint = json.loads((bundle / "config.json").read_text())["process"]["args"]
    mounts = _pod_mounts(tmp_path, "--set", f"frontProxy.port={port}", *values)
    command, run_bundle = _runc_args(bundle, entrypoint, tmp_path, host_network=True, mounts=mounts)
    log = (tmp_path / "haproxy.log").open("w")
    process = subprocess.Popen(command, cwd=run_bundle, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None and not tcp_open(port, "127.0.0.1"):
            time.sleep(0.2)
        assert tcp_open(port, "127.0.0.1"), (tmp_path / "haproxy.log").read_text()[-3000:]
        yield
        assert process.poll() is None, (tmp_path / "haproxy.log").read_text()[-3000:]
    finally:
        runc_root = command[command.index("--root") + 1]
        subprocess.run([command[0], "--root", runc_root, "kill", command[-1], "KILL"], check=False, timeout=30)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        log.close()


def test_the_image_runs_haproxy_as_65532_with_its_configuration_path(image: BuiltImage) -> None:
    config = _image_config(image)
    assert config["config"]["User"] == f"{UID}:{UID}"
    assert (
        config["config"]["Entrypoint"]
        == list(SPEC.entrypoint)
        == ["/usr/sbin/haproxy", "-db", "-f", FRONT_PROXY_CONFIG]
    )
    assert config["config"]["Env"] == [f"{k}={v}" for k, v in BASE_ENV.items()], "no Python in this image"
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "tether-front-proxy"
    # The recipe's digest, never the wheel's (built beside agentk, the image once took the wheel's and so changed
    # with sources it does not contain).
    assert labels["org.opencontainers.image.revision"] == hashlib.sha256(_recipe_digest().encode()).hexdigest()[:12]
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
    again = build_image("front-proxy", "--force")
    assert not again.cached
    assert again.digest == image.digest


def test_haproxy_in_the_image_accepts_the_charts_configuration(bundle: Path, tmp_path: Path) -> None:
    """``haproxy -c`` in the image on the chart's unchanged file, on a read-only root as uid 65532."""
    check = ["/usr/sbin/haproxy", "-c", "-f", FRONT_PROXY_CONFIG]
    command, run_bundle = _runc_args(bundle, check, tmp_path, mounts=_pod_mounts(tmp_path))
    result = _run(command, cwd=run_bundle)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout


def test_the_image_serves_the_charts_configuration(bundle: Path, tmp_path: Path) -> None:
    """The image's own entrypoint listens with the chart's configuration, even under runc's file-descriptor
    limit of 1024 (below what maxconn 20000 asks: ``no strict-limits``)."""
    with _serving(bundle, tmp_path, free_port()):
        pass


@pytest.mark.k8s
@pytest.mark.redis
async def test_agentk_reaches_kas_through_the_image_and_the_charts_configuration(
    bundle: Path, tmp_path: Path, system: System, kas_hub: RealHub, k8s_cluster: ClusterInfo, kubectl: Kubectl
) -> None:
    """A real agentk connects to the proxy (the image, the chart's haproxy.cfg), which relays it to a real kas
    by kas' Service name; kubectl through kas then reaches the cluster over the tunnels agentk opened."""
    agent_id, project = 7601, 76
    kas_hub.add_agent("image-front-proxy-agent", agent_id, project)
    kas_hub.grant_proxy_access("image-front-proxy-pat", "viewer-7601", agent_id, project)
    kas = system.kas()
    port = free_port()
    with _serving(bundle, tmp_path, port, "--set", f"kas.listeners.agent={kas.ports['agent']}"):
        system.agentk_at("image-front-proxy-agent", f"grpc://127.0.0.1:{port}", "agentk-behind-image-proxy")

        async def connected() -> bool:
            return kas.private_url in await system.tunnel_urls(agent_id)

        await wait_for(connected, 60, "the agent's tunnels on kas, through the proxy")
        kubeconfig = proxy_kubeconfig(tmp_path / "kubeconfig", kas, f"pat:{agent_id}:image-front-proxy-pat")
        listing = json.loads((await run(Kubectl(kubectl.binary, kubeconfig), "get", "ns", "-o", "json")).stdout)
        assert "default" in {item["metadata"]["name"] for item in listing["items"]}


def test_haproxy_version_in_the_image(bundle: Path, tmp_path: Path) -> None:
    """Debian 12's HAProxy: >= 2.6, as deploy/front-proxy/haproxy.cfg.template requires."""
    result = _runc(bundle, ["/usr/sbin/haproxy", "-v"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("HAProxy version 2.6.")
