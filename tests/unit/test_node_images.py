"""The real node's local images (tether_devenv.oci): reproducible OCI archives with a working busybox layer."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tether_devenv import oci


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_same_busybox_gives_the_same_digests(tmp_path: Path) -> None:
    first = oci.write_node_images(tmp_path / "a.tar")
    second = oci.write_node_images(tmp_path / "b.tar")
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    assert set(first) == {oci.PAUSE_IMAGE, oci.BUSYBOX_IMAGE, oci.WORKSPACE_IMAGE}


def test_archive_is_an_oci_layout_naming_both_images(tmp_path: Path) -> None:
    digests = oci.write_node_images(tmp_path / "images.tar")
    files = _members(tmp_path / "images.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    named = {m["annotations"]["io.containerd.image.name"]: m["digest"] for m in index["manifests"]}
    assert named == digests
    manifest = json.loads(files[f"blobs/sha256/{digests[oci.BUSYBOX_IMAGE].split(':')[1]}"])
    layer_name = f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"
    (tmp_path / "layer.tar").write_bytes(files[layer_name])
    with tarfile.open(tmp_path / "layer.tar") as layer:
        names = {m.name: m for m in layer.getmembers()}
    # kubectl cp needs tar, the tests need sh, httpd, nslookup and wget; all point at the one static binary.
    for applet in ("sh", "tar", "httpd", "nslookup", "wget", "sleep"):
        assert names[f"bin/{applet}"].issym() and names[f"bin/{applet}"].linkname == "busybox"
    assert names["tmp"].mode == 0o1777
    assert all(m.mtime == 0 and m.uid == 0 for m in names.values())


def test_dynamic_busybox_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(b"\x7fELF.../lib64/ld-linux-x86-64.so.2...")
    with pytest.raises(oci.ImageError, match="dynamically linked"):
        oci.write_node_images(tmp_path / "x.tar", busybox=fake)
    with pytest.raises(oci.ImageError, match="busybox-static"):
        oci.write_node_images(tmp_path / "x.tar", busybox=tmp_path / "missing")
