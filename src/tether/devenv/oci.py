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

from tether.devenv.process import EnvironmentProblem

BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "localhost/tether/pause:local"
BUSYBOX_IMAGE = "localhost/tether/busybox:local"
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
        annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
        manifests.append(
            manifest.descriptor(platform={"architecture": "amd64", "os": "linux"}, annotations=annotations)
        )
    index = _json_blob("application/vnd.oci.image.index.v1+json", {"schemaVersion": 2, "manifests": manifests})
    files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index.data}
    files.update({f"blobs/sha256/{digest.split(':', 1)[1]}": blob.data for digest, blob in blobs.items()})
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(_tar_info(directory, tarfile.DIRTYPE, 0o755))
        for name in sorted(files):
            tar.addfile(_tar_info(name, tarfile.REGTYPE, 0o644, len(files[name])), io.BytesIO(files[name]))
    return names
