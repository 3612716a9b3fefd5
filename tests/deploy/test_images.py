"""The agentk image built by ``make images``: reproducible, non-root, shell-less, runs on a read-only root.

The image is built (or reused from ``~/.cache/tether/images``) with the real tools (mmdebstrap, umoci), unpacked
with umoci into an OCI runtime bundle made from the image's own configuration, and run with runc as uid 65532
on a read-only root filesystem without capabilities.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.system import System, http_get
from tether_devenv.cluster import ClusterInfo
from tether_devenv.images import ENV, IMAGES, UID, BuiltImage
from tether_devenv.process import free_port

_TIMEOUT = 600


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False, timeout=_TIMEOUT)


def build_image(name: str, *args: str) -> BuiltImage:
    """``make images`` for image ``name`` alone (e.g. ``agentk``), in its own process as the Makefile runs it."""
    result = _run([sys.executable, "-m", "tether_devenv.images", "--json", *args, name])
    assert result.returncode == 0, result.stderr
    fields = json.loads(result.stdout)
    return BuiltImage(**{**fields, "archive": Path(fields["archive"])})


def unpack_image(image: BuiltImage, work: Path) -> Path:
    """``image`` unpacked by umoci under ``work``: ``rootfs/`` and the runtime ``config.json`` derived from the
    image config; returns that bundle directory."""
    with tarfile.open(image.archive) as archive:
        archive.extractall(work / "layout", filter="data")
    result = _run(["umoci", "unpack", "--image", f"{work / 'layout'}:{image.reference}", str(work / "bundle")])
    assert result.returncode == 0, result.stderr
    return work / "bundle"


@pytest.fixture(scope="module")
def agentk_image() -> BuiltImage:
    return build_image("agentk")


@pytest.fixture(scope="module")
def bundle(agentk_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_image(agentk_image, tmp_path_factory.mktemp("agentk-image"))


def _image_config(agentk_image: BuiltImage) -> dict:  # type: ignore[type-arg]
    with tarfile.open(agentk_image.archive) as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(archive.extractfile(f"blobs/sha256/{manifest_digest}"))  # type: ignore[arg-type]
        config_digest = manifest["config"]["digest"].split(":")[1]
        return json.load(archive.extractfile(f"blobs/sha256/{config_digest}"))  # type: ignore[arg-type,no-any-return]


def test_the_image_config_runs_agentk_as_uid_65532(agentk_image: BuiltImage) -> None:
    config = _image_config(agentk_image)
    assert config["config"]["User"] == f"{UID}:{UID}" == "65532:65532"
    assert config["config"]["Entrypoint"] == list(IMAGES["agentk"].entrypoint) == ["/usr/local/bin/tether", "agentk"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["config"]["Env"]
    assert [f"{k}={v}" for k, v in ENV.items()] == config["config"]["Env"]
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "tether-agentk"
    assert labels["org.opencontainers.image.version"] == agentk_image.reference.rsplit(":", 1)[1]
    assert not config.get("history"), "history entries carry build times"


def test_the_runtime_image_has_no_shell_package_manager_or_compiler(bundle: Path) -> None:
    rootfs = bundle / "rootfs"
    for tool in ("sh", "bash", "dash", "apt", "apt-get", "dpkg", "perl", "gcc", "cc", "tar", "ls"):
        for directory in ("bin", "usr/bin", "sbin", "usr/sbin", "usr/local/bin"):
            assert not (rootfs / directory / tool).exists(), f"/{directory}/{tool} is in the image"
    assert not list(rootfs.rglob("*.pyc")), "bytecode files make builds unreproducible"
    assert (rootfs / "etc/ssl/certs/ca-certificates.crt").stat().st_size > 100_000
    owners = {p.lstat().st_uid for p in rootfs.rglob("*")}
    assert owners == {0}, "every file belongs to root, so uid 65532 cannot change the image"


def test_rebuilding_gives_the_same_digest(agentk_image: BuiltImage) -> None:
    again = build_image("agentk", "--force")
    assert not again.cached
    assert again.digest == agentk_image.digest
    assert again.uncompressed_bytes == agentk_image.uncompressed_bytes


def _runc_args(
    bundle: Path, args: list[str], tmp_path: Path, host_network: bool = False, **options: Any
) -> tuple[list[str], Path]:
    """runc's command line for ``args`` in the image: uid 65532, read-only root, no capabilities.

    The process gets a fresh network namespace unless ``host_network``; ``options`` may add ``env`` (a list of
    ``K=V``), ``mounts`` (read-only bind mounts, host path -> container path) and ``tmpfs_tmp`` (a tmpfs on /tmp).
    """
    config = json.loads((bundle / "config.json").read_text())
    process = config["process"]
    assert process["user"]["uid"] == UID
    process["terminal"] = False
    process["args"] = args
    process["env"] += options.get("env", [])
    process["capabilities"] = {kind: [] for kind in process["capabilities"]}
    config["root"] = {"path": str(bundle / "rootfs"), "readonly": True}
    for source, destination in options.get("mounts", {}).items():
        config["mounts"].append(
            {"destination": destination, "type": "bind", "source": source, "options": ["rbind", "ro"]}
        )
    if options.get("tmpfs_tmp"):
        # What the charts give every pod: an emptyDir on /tmp (agentk's internal server binds a socket there).
        config["mounts"].append(
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]}
        )
    if host_network:
        namespaces = config["linux"]["namespaces"]
        config["linux"]["namespaces"] = [n for n in namespaces if n["type"] != "network"]
    run_bundle = tmp_path / "bundle"
    run_bundle.mkdir()
    (run_bundle / "config.json").write_text(json.dumps(config))
    runc = shutil.which("runc") or "/usr/sbin/runc"
    return [runc, "--root", str(tmp_path / "state"), "run", f"t-{uuid.uuid4().hex[:8]}"], run_bundle


def _runc(bundle: Path, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    command, run_bundle = _runc_args(bundle, args, tmp_path)
    return _run(command, cwd=run_bundle)


def test_agentk_help_runs_in_the_image_as_65532_on_a_read_only_root(bundle: Path, tmp_path: Path) -> None:
    config = json.loads((bundle / "config.json").read_text())
    result = _runc(bundle, [*config["process"]["args"], "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--kas-address" in result.stdout


def test_agentk_modules_import_in_the_image(bundle: Path, tmp_path: Path) -> None:
    """Every native extension agentk loads finds its shared libraries among the allow-listed packages."""
    probe = (
        "import os, ssl, sqlite3, tether.agentk.app, tether.agentk.modules, grpc, uvloop, hiredis, msgspec, "
        "pydantic_core, yaml, cel_expr_python, aiohttp; "
        "assert os.getuid() == 65532; print(ssl.create_default_context().cert_store_stats()['x509_ca'] > 100)"
    )
    result = _runc(bundle, ["/usr/bin/python3", "-c", probe], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True", "the system CA certificates load by default (grpcs, rediss)"


def test_strip_never_changes_a_file_hard_linked_elsewhere(tmp_path: Path) -> None:
    """uv links wheels' files from its cache; stripping in place once changed the shared venv under running tests."""
    from tether_devenv.images import _strip  # noqa: PLC0415 (the one private helper under test)

    shared = tmp_path / "cache" / "lib.so"
    shared.parent.mkdir()
    # Any ELF file: the interpreter running the tests (``python3`` on PATH may be a pyenv shim, a shell script).
    shutil.copyfile(Path(sys.executable).resolve(), shared)
    (tmp_path / "site").mkdir()
    linked = tmp_path / "site" / "lib.so"
    linked.hardlink_to(shared)
    before = shared.read_bytes()
    _strip(tmp_path / "site")
    assert shared.read_bytes() == before
    assert linked.stat().st_ino != shared.stat().st_ino


@pytest.mark.k8s
def test_agentk_in_the_image_connects_to_kas_and_gets_ready(
    bundle: Path, tmp_path: Path, system: System, kas_hub: RealHub, k8s_cluster: ClusterInfo
) -> None:
    """The image's own entrypoint, as the chart runs it: a token file, POD_* variables, a read-only root."""
    token = "image-agent-token"
    kas_hub.add_agent(token, 9301, 9301, name="image")
    kas = system.kas()
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text(token + "\n")
    secrets.chmod(0o755)
    (secrets / "token").chmod(0o644)
    port = free_port()
    config = json.loads((bundle / "config.json").read_text())
    args = [*config["process"]["args"], f"--kas-address={kas.agent_address}"]
    args += ["--token-file=/etc/agentk/secrets/token", f"--observability-listen-address=127.0.0.1:{port}"]
    args += [f"--kubeconfig=/etc/agentk/kube/{k8s_cluster.kubeconfig.name}"]
    # The admin kubeconfig and its certificates are root's (0600): a readable copy takes their place for uid 65532.
    kube_dir = k8s_cluster.kubeconfig.parent
    readable = tmp_path / "kube"
    shutil.copytree(kube_dir, readable, ignore=shutil.ignore_patterns("etcd*", "*.log", "*.sock"))
    for copied in readable.rglob("*"):
        copied.chmod(0o755 if copied.is_dir() else 0o644)
    kubeconfig = readable / k8s_cluster.kubeconfig.name
    kubeconfig.write_text(kubeconfig.read_text().replace(str(kube_dir), "/etc/agentk/kube"))
    mounts = {str(secrets): "/etc/agentk/secrets", str(readable): "/etc/agentk/kube"}
    env = ["POD_NAME=agentk-image-0", "POD_NAMESPACE=tether-system"]
    command, run_bundle = _runc_args(bundle, args, tmp_path, host_network=True, env=env, mounts=mounts, tmpfs_tmp=True)
    log = (tmp_path / "agentk.log").open("w")
    process = subprocess.Popen(command, cwd=run_bundle, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError):  # not listening yet
                status, _ = http_get(f"http://127.0.0.1:{port}/readiness")
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, (tmp_path / "agentk.log").read_text()[-3000:]
    finally:
        runc_root = command[command.index("--root") + 1]
        subprocess.run([command[0], "--root", runc_root, "kill", command[-1], "TERM"], check=False, timeout=30)
        code = process.wait(timeout=60)
        log.close()
    assert code == 0, (tmp_path / "agentk.log").read_text()[-3000:]
