"""The real node's local images: a pause image and a small test image, from Debian's static busybox.

No registry is reachable on these machines, so the images a node needs first (the pod sandbox's "pause"
image and a busybox-like image for tests and the volume provisioner's helper pods) are written here as one
OCI image layout archive (image-spec v1.1: ``oci-layout``, ``index.json``, ``blobs/sha256/...``) that
``ctr -n k8s.io images import`` loads (``../shared/reference/deployment.md`` §1). Both images share one
layer: ``/bin/busybox`` from the ``busybox-static`` package plus a symlink per applet, so ``sh``, ``tar``
(``kubectl cp``), ``httpd``, ``nslookup`` and ``sleep`` exist. Everything is written deterministically
(sorted entries, zero timestamps, root owner), so the same busybox gives the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tether_devenv.process import EnvironmentProblem

BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "localhost/tether/pause:local"
BUSYBOX_IMAGE = "localhost/tether/busybox:local"
#: A trial Redis for the ``tether`` chart's bundled Redis on a node without a registry (its default is ``redis:7.4``).
REDIS_IMAGE = "localhost/tether/redis:local"
REDIS_SERVER = Path("/usr/bin/redis-server")
REDIS_UID = 999
#: A development environment that runs until stopped (busybox's shell and tools): the image of the default
#: devfile under ``tether up``, whose workspaces cannot pull GitLab's workspace image without a registry.
WORKSPACE_IMAGE = "localhost/tether/workspace:local"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The sandbox's only job is to hold the pod's namespaces until it is told to stop (and reap orphans, as sh does).
_PAUSE_CMD = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while true; do sleep 3600 & wait $!; done"]


class ImageError(EnvironmentProblem):
    """The image cannot be built; the message says what to install."""


@dataclass(frozen=True)
class _Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **extra}


def _tar_info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _busybox_layer(busybox: Path) -> bytes:
    if not busybox.is_file():
        raise ImageError(f"{busybox} is missing: install Debian's busybox-static package (scripts/bootstrap.sh does)")
    binary = busybox.read_bytes()
    if b"/lib64/ld-linux" in binary or b"/lib/ld-linux" in binary:
        raise ImageError(f"{busybox} is dynamically linked: the images need busybox-static's static binary")
    listing = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True, timeout=30).stdout
    applets = sorted({a for a in listing.split() if a and "/" not in a and a != "busybox"})
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory, mode in (("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777), ("var", 0o755)):
            tar.addfile(_tar_info(directory, tarfile.DIRTYPE, mode))
        tar.addfile(_tar_info("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), io.BytesIO(binary))
        for applet in applets:
            tar.addfile(_tar_info(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        for name, text in (
            ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
            ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
        ):
            data = text.encode()
            tar.addfile(_tar_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return out.getvalue()


def _json_blob(media_type: str, value: object) -> _Blob:
    return _Blob(media_type, json.dumps(value, sort_keys=True, separators=(",", ":")).encode())


def _image(layer: _Blob, cmd: list[str], workdir: str = "/") -> tuple[_Blob, _Blob]:
    config = _json_blob(
        "application/vnd.oci.image.config.v1+json",
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": cmd, "Env": [f"PATH={_PATH}"], "WorkingDir": workdir},
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        },
    )
    manifest = _json_blob(
        "application/vnd.oci.image.manifest.v1+json",
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config.descriptor(),
            "layers": [layer.descriptor()],
        },
    )
    return config, manifest


def _libraries(binary: Path) -> list[str]:
    """The shared objects ``binary`` loads, as the paths the dynamic loader looks them up at (``ldd``)."""
    listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=30).stdout
    found = []
    for line in listing.splitlines():
        words = line.split()
        path = words[2] if len(words) > 2 and words[1] == "=>" else words[0] if words else ""
        if path.startswith("/"):
            found.append(path)
    return found


def _redis_layer(binary: Path) -> bytes:
    if not binary.is_file():
        raise ImageError(f"{binary} is missing: install Debian's redis-server package (scripts/bootstrap.sh does)")
    files = {binary.as_posix(): binary.read_bytes()}
    files.update({path: Path(path).resolve().read_bytes() for path in _libraries(binary)})
    files["etc/passwd"] = f"redis:x:{REDIS_UID}:{REDIS_UID}:redis:/data:/bin/false\n".encode()
    files["etc/group"] = f"redis:x:{REDIS_UID}:\n".encode()
    names = {name.lstrip("/"): data for name, data in files.items()}
    directories = {"data", "tmp"} | {
        str(parent) for name in names for parent in Path(name).parents if str(parent) != "."
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            tar.addfile(_tar_info(directory, tarfile.DIRTYPE, 0o1777 if directory in ("data", "tmp") else 0o755))
        for name in sorted(names):
            mode = 0o644 if name.startswith("etc/") else 0o755
            tar.addfile(_tar_info(name, tarfile.REGTYPE, mode, len(names[name])), io.BytesIO(names[name]))
    return out.getvalue()


def _write_archive(archive: Path, blobs: dict[str, _Blob], manifests: list[dict[str, object]]) -> None:
    index = _json_blob("application/vnd.oci.image.index.v1+json", {"schemaVersion": 2, "manifests": manifests})
    files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index.data}
    files.update({f"blobs/sha256/{digest.split(':', 1)[1]}": blob.data for digest, blob in blobs.items()})
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(_tar_info(directory, tarfile.DIRTYPE, 0o755))
        for name in sorted(files):
            tar.addfile(_tar_info(name, tarfile.REGTYPE, 0o644, len(files[name])), io.BytesIO(files[name]))


def _descriptor(manifest: _Blob, name: str) -> dict[str, object]:
    annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    return manifest.descriptor(platform={"architecture": "amd64", "os": "linux"}, annotations=annotations)


def write_redis_image(archive: Path, binary: Path = REDIS_SERVER) -> str:
    """Write :data:`REDIS_IMAGE` (Debian's ``redis-server`` and the libraries it loads) as an OCI archive.

    For the ``tether`` chart's bundled Redis where no registry is reachable (the chart's default image is
    ``redis:7.4``). The entrypoint is ``redis-server --protected-mode no``, as the official image behaves (it
    turns protected mode off at build time): kas connects from other pods without a password; the
    chart's arguments follow. Runs as uid 999 (the chart's Redis securityContext) on a read-only root.

    Returns:
        the manifest digest (``sha256:...``), the same for the same binary and libraries.

    Raises:
        ImageError: redis-server is not installed.
    """
    layer = _Blob("application/vnd.oci.image.layer.v1.tar", _redis_layer(binary))
    config = _json_blob(
        "application/vnd.oci.image.config.v1+json",
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": [binary.as_posix(), "--protected-mode", "no"],
                "Env": [f"PATH={_PATH}"],
                "WorkingDir": "/data",
                "User": f"{REDIS_UID}:{REDIS_UID}",
            },
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        },
    )
    manifest = _json_blob(
        "application/vnd.oci.image.manifest.v1+json",
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config.descriptor(),
            "layers": [layer.descriptor()],
        },
    )
    blobs = {blob.digest: blob for blob in (layer, config, manifest)}
    _write_archive(archive, blobs, [_descriptor(manifest, REDIS_IMAGE)])
    return manifest.digest


def write_node_images(archive: Path, busybox: Path = BUSYBOX) -> dict[str, str]:
    """Write the pause, busybox and workspace images as one OCI layout archive at ``archive``.

    Returns:
        image name -> manifest digest (``sha256:...``), the same for the same busybox binary.

    Raises:
        ImageError: busybox-static is not installed.
    """
    layer = _Blob("application/vnd.oci.image.layer.v1.tar", _busybox_layer(busybox))
    blobs = {layer.digest: layer}
    manifests = []
    names = {}
    for name, cmd, workdir in (
        (PAUSE_IMAGE, _PAUSE_CMD, "/"),
        (BUSYBOX_IMAGE, ["/bin/sh"], "/"),
        (WORKSPACE_IMAGE, _PAUSE_CMD, "/projects"),  # a workspace's volume is mounted on /projects
    ):
        config, manifest = _image(layer, cmd, workdir)
        blobs[config.digest], blobs[manifest.digest] = config, manifest
        names[name] = manifest.digest
        manifests.append(_descriptor(manifest, name))
    _write_archive(archive, blobs, manifests)
    return names
