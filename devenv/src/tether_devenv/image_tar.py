"""Reproducible tar archives for image layers and OCI archives: sorted, owner root, one fixed time."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["reproducible_tar"]


def _walk_sorted(root: Path) -> Iterator[str]:
    """Relative paths under ``root`` in a stable order (byte order of the names, parents first)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            yield name if rel_dir == "." else f"{rel_dir}/{name}"
        for name in dirnames:
            if not os.path.islink(os.path.join(dirpath, name)):
                yield (name if rel_dir == "." else f"{rel_dir}/{name}") + "/"


def reproducible_tar(root: Path, out: Path, epoch: int) -> int:
    """Write ``root`` as a tar: sorted, owner root (0:0), every mtime ``epoch``; return the uncompressed size.

    Raises:
        ValueError: something else than a directory, a regular file or a symbolic link (a device node, a socket).
    """
    paths = sorted(_walk_sorted(root), key=lambda p: p.rstrip("/").split("/"))
    with out.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in paths:
            path = root / rel.rstrip("/")
            st = path.lstat()
            info = tarfile.TarInfo(rel.rstrip("/"))
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                raise ValueError(f"{rel}: only directories, files and symlinks may be in an image")
    return out.stat().st_size
