"""The Debian runtime root filesystem of Tether's images: ``mmdebstrap`` plus a package allow-list.

``mmdebstrap --variant=extract`` unpacks the packages without running maintainer scripts; every file that does
not come from a package of :data:`RUNTIME_PACKAGES` is then deleted. apt pulls in ``dpkg``, ``tar``,
``perl-base``... as dependencies; none of them stays, so there is no shell, no package manager and no compiler.
Used by ``images.py`` (``make images``), cached per package list.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["DEBIAN_SUITE", "FRONT_PROXY_PACKAGES", "RUNTIME_PACKAGES", "ImageBuildError", "base_rootfs", "run"]

Progress = Callable[[str], None]

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"

#: Debian packages whose files make up the runtime image (allow-list). Python 3.11 and the shared libraries
#: its standard library and our wheels load (grpcio and pydantic-core need libstdc++/libgcc_s), CA certificates,
#: time zones, /etc/services (netbase) and /etc/os-release (base-files) for scanners.
RUNTIME_PACKAGES: tuple[str, ...] = (
    "base-files",
    "ca-certificates",
    "gcc-12-base",
    "libbz2-1.0",
    "libc6",
    "libcom-err2",
    "libcrypt1",
    "libdb5.3",
    "libexpat1",
    "libffi8",
    "libgcc-s1",
    "libgssapi-krb5-2",
    "libk5crypto3",
    "libkeyutils1",
    "libkrb5-3",
    "libkrb5support0",
    "liblzma5",
    "libncursesw6",
    "libnsl2",
    "libpython3-stdlib",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libreadline8",
    "libsqlite3-0",
    "libssl3",
    "libstdc++6",
    "libtinfo6",
    "libtirpc-common",
    "libtirpc3",
    "libuuid1",
    "libzstd1",
    "media-types",
    "netbase",
    "python3",
    "python3-minimal",
    "python3.11",
    "python3.11-minimal",
    "tzdata",
    "zlib1g",
)

#: The front proxy's image (HAProxy before kas' agent listener, ``deploy/front-proxy/``): Debian's ``haproxy``
#: and the shared libraries ``/usr/sbin/haproxy`` loads (``ldd``), base-files for /etc/os-release. No Python.
FRONT_PROXY_PACKAGES: tuple[str, ...] = (
    "base-files",
    "gcc-12-base",
    "haproxy",
    "libc6",
    "libcap2",
    "libcrypt1",
    "libgcc-s1",
    "libgcrypt20",
    "libgpg-error0",
    "liblua5.3-0",
    "liblz4-1",
    "liblzma5",
    "libopentracing-c-wrapper0",
    "libopentracing1",
    "libpcre2-8-0",
    "libssl3",
    "libstdc++6",
    "libsystemd0",
    "libzstd1",
)

#: Package files left out of the image: documentation (but each package's ``copyright`` stays), manuals,
#: translations, bug-report and lintian metadata, Python's test suite and IDLE.
_EXCLUDED = re.compile(
    r"^usr/share/(?:doc/[^/]+/(?!copyright$).*|man/|info/|locale/|lintian/|bug/|doc-base/|bash-completion/"
    r"|pixmaps/|applications/|binfmts/|python3/debian_defaults|python3/runtime\.d/)"
    r"|^usr/lib/python3\.11/(?:test/|idlelib/|lib2to3/tests/|ensurepip/)"
    r"|^usr/lib/binfmt\.d/|^usr/lib/valgrind/"
)


class ImageBuildError(RuntimeError):
    """A build step failed; the message names the step, the command and its output tail."""


def run(args: Sequence[str], step: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a build tool and return its stdout.

    Raises:
        ImageBuildError: the tool is missing (what installs it) or failed (its output tail).
    """
    try:
        result = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise ImageBuildError(
            f"{step}: {args[0]} is not installed; `bash scripts/bootstrap.sh` installs mmdebstrap and umoci"
        ) from exc
    if result.returncode != 0:
        tail = "\n    ".join((result.stderr or result.stdout).strip().splitlines()[-25:])
        raise ImageBuildError(f"{step} failed (exit {result.returncode}): {' '.join(args)}\n    {tail}")
    return result.stdout


def _deb_files(deb: Path) -> list[str]:
    """Paths (no leading ``./``) a ``.deb`` ships, from its data archive."""
    result = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"dpkg-deb --fsys-tarfile {deb}: {result.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:") as tar:
        return [m.name.removeprefix("./").rstrip("/") for m in tar if m.name not in (".", "./")]


def _allowed_paths(archives: Path, packages: Sequence[str]) -> tuple[set[str], str]:
    """Every path ``packages`` ship (minus :data:`_EXCLUDED`) and Debian's Python version ("" without Python)."""
    allowed: set[str] = set()
    python_version = ""
    found: set[str] = set()
    for deb in sorted(archives.glob("*.deb")):
        package, version = deb.name.split("_")[:2]
        if package not in packages:
            continue
        found.add(package)
        if package == "python3.11-minimal":
            python_version = version.split("-")[0]
        allowed.update(p for p in _deb_files(deb) if not _EXCLUDED.match(p))
    missing = sorted(set(packages) - found)
    if missing:
        raise ImageBuildError(f"mmdebstrap did not download {', '.join(missing)}: check the package names")
    return allowed, python_version


def _prune(root: Path, allowed: set[str]) -> None:
    """Delete everything under ``root`` that is not in ``allowed`` (or a directory above an allowed path)."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel not in allowed:
                os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and rel not in allowed:
                with contextlib.suppress(OSError):  # not empty: something allowed lives below
                    os.rmdir(path)


def base_rootfs(
    cache: Path, epoch: int, progress: Progress, packages: Sequence[str] = RUNTIME_PACKAGES
) -> tuple[Path, str]:
    """The pruned Debian rootfs of ``packages`` in ``cache`` and its Python version (``3.11.2``; "" without).

    Each package list has its own rootfs (``base-<key>`` for :data:`RUNTIME_PACKAGES`, ``base-<main
    package>-<key>`` for another list such as :data:`FRONT_PROXY_PACKAGES`); an outdated one of the same list
    is removed.

    Raises:
        ImageBuildError: mmdebstrap or dpkg-deb failed, or an allow-listed package is missing.
    """
    packages = tuple(packages)
    key = hashlib.sha256(json.dumps([DEBIAN_SUITE, DEBIAN_MIRROR, packages, _EXCLUDED.pattern, epoch]).encode())
    # The Python list keeps its historical name, so caches built before other lists existed stay valid.
    prefix = "base" if packages == RUNTIME_PACKAGES else f"base-{_list_name(packages)}"
    base = cache / f"{prefix}-{key.hexdigest()[:16]}"
    info = base.with_suffix(".json")
    if base.is_dir() and info.is_file():
        return base, str(json.loads(info.read_text())["python"])
    same_list = re.compile(re.escape(prefix) + r"-[0-9a-f]{16}(?:\.json)?")
    for old in cache.iterdir():
        if same_list.fullmatch(old.name):
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    partial = cache / f".partial-{base.name}"
    shutil.rmtree(partial, ignore_errors=True)
    progress(f"images: mmdebstrap {DEBIAN_SUITE} ({len(packages)} packages) into {base}")
    started = time.monotonic()
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    run(
        [
            "mmdebstrap",
            "--quiet",
            "--mode=root",
            "--variant=extract",
            "--format=directory",
            "--skip=cleanup/apt/cache",
            "--include=" + ",".join(packages),
            DEBIAN_SUITE,
            str(partial),
            DEBIAN_MIRROR,
        ],
        "mmdebstrap",
        env=env,
    )
    allowed, python_version = _allowed_paths(partial / "var/cache/apt/archives", packages)
    if "python3.11-minimal" in packages and not python_version.startswith("3.11."):
        raise ImageBuildError(f"Debian's python3.11-minimal has version {python_version!r}, expected 3.11.x")
    _prune(partial, allowed)
    partial.rename(base)
    info.write_text(json.dumps({"python": python_version, "packages": list(packages)}))
    progress(f"images: base rootfs ready ({time.monotonic() - started:.0f}s, Python {python_version or 'none'})")
    return base, python_version


def _list_name(packages: Sequence[str]) -> str:
    """A readable name for a package list other than Python's: its main package (``haproxy``)."""
    return next((p for p in packages if not p.startswith(("base-", "gcc-", "lib"))), "other")
