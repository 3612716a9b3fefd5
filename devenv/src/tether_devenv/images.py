"""Container images for kas, agentk, the hub and the front proxy, built without a container daemon (issue 22 item 2).

Recipe (``../shared/reference/deployment.md`` §1):

1. A Debian 12 base rootfs from ``mmdebstrap --variant=extract``: the packages are unpacked, no maintainer
   script runs, and afterwards every file that does not come from a package of :data:`RUNTIME_PACKAGES`
   is removed (an allow-list: apt pulls in ``dpkg``, ``tar``, ``perl-base``... as dependencies; none of
   them stays, so there is no shell, no package manager and no compiler). Cached per package list
   (``image_rootfs.py``).
2. Our wheel (hatchling, ``SOURCE_DATE_EPOCH``) and its dependencies pinned by ``uv.lock`` (``uv export``,
   with hashes, binary wheels only) installed by ``uv pip install --target`` into
   ``/usr/local/lib/python3.11/dist-packages``: the package without extras for kas and agentk (README), with
   the ``hub`` extra for the hub. No ``.pyc`` files: their timestamps break reproducibility and a
   read-only root cannot take them anyway (``PYTHONDONTWRITEBYTECODE``).
   The front proxy's image (HAProxy before kas' agent listener, ``deploy/front-proxy/``) skips this step: it
   is :data:`FRONT_PROXY_PACKAGES` alone, with HAProxy as its entrypoint and no Python.
3. One layer tar written in a reproducible way (``image_tar.py``: sorted names, owner root, every mtime
   ``SOURCE_DATE_EPOCH``), then the OCI image layout by ``umoci`` (Debian's): ``raw add-layer`` and
   ``config`` (user 65532, entrypoint, environment, OCI labels, fixed creation time, no history).
4. The layout packed as an OCI archive (``ctr -n k8s.io images import`` takes it), sorted and dated the
   same way, so the same inputs give the same manifest digest.

Results are cached in ``<cache>/images/<name>/`` under a key over every input; ``make images`` reuses them.
The ``Containerfile`` at the repository root runs :func:`stage_rootfs` in its build stage and states
:data:`UID`, :data:`ENV` and each image's entrypoint, which ``tests/deploy/test_containerfile.py`` checks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tether import __version__
from tether_devenv.assets import cache_root
from tether_devenv.image_rootfs import (
    DEBIAN_SUITE,
    FRONT_PROXY_PACKAGES,
    RUNTIME_PACKAGES,
    ImageBuildError,
    base_rootfs,
    run,
)
from tether_devenv.image_tar import reproducible_tar

__all__ = [
    "BASE_ENV",
    "DEFAULT_EPOCH",
    "ENV",
    "FRONT_PROXY_CONFIG",
    "IMAGES",
    "RUNTIME_PACKAGES",
    "UID",
    "BuiltImage",
    "ImageBuildError",
    "ImageSpec",
    "build_images",
    "main",
    "stage",
    "stage_rootfs",
]

Progress = Callable[[str], None]

#: The runtime user and group: distroless' ``nonroot``, as upstream's images use (deployment.md §2).
UID = 65532
#: Used when ``SOURCE_DATE_EPOCH`` is not set: 2025-01-01T00:00:00Z (any fixed value makes builds repeatable).
DEFAULT_EPOCH = 1735689600
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
LAUNCHER = "usr/local/bin/tether"
#: Image repository prefix; the tag is the package version (``localhost/tether/agentk:0.1.0``).
REPOSITORY = "localhost/tether"

#: Environment of every image: a writable HOME (the root is read-only).
BASE_ENV: dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
#: Environment of the Python images: also no bytecode writes (read-only root) and unbuffered logs.
ENV: dict[str, str] = {**BASE_ENV, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
#: Where the front proxy's image reads its HAProxy configuration (the chart mounts a ConfigMap there).
FRONT_PROXY_CONFIG = "/etc/tether/front-proxy/haproxy.cfg"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its name, the wheel extra it installs and the process it runs.

    Attributes:
        name: image name (``agentk``, ``kas``, ``hub``, ``front-proxy``); the repository is
            ``localhost/tether/<name>``.
        extra: the ``tether`` extra installed besides the base dependencies (None: none).
        entrypoint: the container's entrypoint (argv).
        description: the ``org.opencontainers.image.description`` label.
        packages: the Debian packages of its root filesystem (:data:`RUNTIME_PACKAGES` for Tether's own).
        python: whether Tether's wheel and its dependencies are installed (False: Debian packages only).
    """

    name: str
    extra: str | None
    entrypoint: tuple[str, ...]
    description: str
    packages: tuple[str, ...] = RUNTIME_PACKAGES
    python: bool = True

    @property
    def reference(self) -> str:
        """The image reference recorded in the archive, e.g. ``localhost/tether/agentk:0.1.0``."""
        return f"{REPOSITORY}/{self.name}:{__version__}"

    @property
    def env(self) -> dict[str, str]:
        """The image's environment: :data:`ENV` for the Python images, :data:`BASE_ENV` otherwise."""
        return ENV if self.python else BASE_ENV


IMAGES: dict[str, ImageSpec] = {
    spec.name: spec
    for spec in (
        ImageSpec("agentk", None, ("/" + LAUNCHER, "agentk"), "Tether agentk: the agent in the cluster"),
        ImageSpec("kas", None, ("/" + LAUNCHER, "kas"), "Tether kas: the agent server"),
        ImageSpec("hub", "hub", ("/" + LAUNCHER, "hub", "serve"), "Tether hub: the control plane"),
        # -db: HAProxy stays in the foreground as the container's one process (no daemon, no master).
        ImageSpec(
            "front-proxy",
            None,
            ("/usr/sbin/haproxy", "-db", "-f", FRONT_PROXY_CONFIG),
            "Tether front proxy: HAProxy before kas' agent listener",
            packages=FRONT_PROXY_PACKAGES,
            python=False,
        ),
    )
}


@dataclass(frozen=True)
class BuiltImage:
    """A built (or cached) image.

    Attributes:
        name: image name.
        archive: the OCI archive (``ctr -n k8s.io images import <archive>``).
        reference: the reference recorded in it (``org.opencontainers.image.ref.name``).
        digest: the manifest digest, ``sha256:<hex>``.
        uncompressed_bytes: size of the unpacked root filesystem layer, bytes.
        compressed_bytes: size of the gzip layer blob, bytes.
        cached: True when reused from the cache.
    """

    name: str
    archive: Path
    reference: str
    digest: str
    uncompressed_bytes: int
    compressed_bytes: int
    cached: bool


def _repo_root() -> Path:
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file() or not (root / "uv.lock").is_file():
        raise ImageBuildError(f"{root} is not a Tether source tree (no pyproject.toml/uv.lock): build from a clone")
    return root


def _epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not value:
        return DEFAULT_EPOCH
    if not value.isdigit():
        raise ImageBuildError(f"SOURCE_DATE_EPOCH={value!r}: expected seconds since 1970 (digits)")
    return int(value)


def _uv() -> list[str]:
    """The uv command: on PATH, else ``python3 -m uv`` as scripts/bootstrap.sh installs it.

    The project's venv has no uv of its own, and a pip-installed uv script is not on PATH until pyenv rehashes.
    """
    found = shutil.which("uv")
    if found:
        return [found]
    # pip puts the script beside the interpreter the venv was made from (`python3 -m pip install uv`).
    beside = Path(sys.base_prefix) / "bin" / "uv"
    if beside.is_file():
        return [str(beside)]
    return [shutil.which("python3") or "python3", "-m", "uv"]


def _digest_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


# --- 2. Python packages ------------------------------------------------------------------------------------


def _wheel(root: Path, out: Path) -> Path:
    """Build Tether's wheel reproducibly (hatchling honours ``SOURCE_DATE_EPOCH``) into ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    vendor = root / "src/tether/hub/console/static/vendor/htmx.min.js"
    if not vendor.is_file():
        raise ImageBuildError(f"{vendor} is missing: run `bash scripts/bootstrap.sh` (npm ci) before building images")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(_epoch()))
    run([*_uv(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(root)], "uv build", cwd=root, env=env)
    wheels = sorted(out.glob("tether-*.whl"))
    if len(wheels) != 1:
        raise ImageBuildError(f"uv build produced {[w.name for w in wheels]}, expected one tether wheel")
    return wheels[0]


def _requirements(root: Path, extra: str | None) -> str:
    """The pinned, hashed dependency list of the package (plus ``extra``) from ``uv.lock``."""
    args = [*_uv(), "export", "--frozen", "--no-dev", "--no-emit-project", "--no-header", "--format"]
    args += ["requirements-txt", *(["--extra", extra] if extra else [])]
    return run(args, "uv export", cwd=root)


def _install_site(target: Path, requirements: Path, wheel: Path | None, python_version: str) -> None:
    """Install the locked dependencies and the wheel (if given) into ``target`` for Debian's Python (binary wheels)."""
    shutil.rmtree(target, ignore_errors=True)
    common = [
        *_uv(),
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--python-version",
        python_version,
        "--python-platform",
        "x86_64-manylinux_2_36",  # Debian 12's glibc 2.36
        "--target",
        str(target),
        # uv hard-links files from its cache by default: stripping them below would change the cache and
        # every environment sharing it, under running processes.
        "--link-mode",
        "copy",
    ]
    run([*common, "--require-hashes", "-r", str(requirements)], "uv pip install (dependencies)")
    if wheel is not None:
        run([*common, str(wheel)], "uv pip install (tether wheel)")
    # Console scripts carry the build host's interpreter path; the image gets its own launcher instead. Their
    # RECORD lines go too: they hold the scripts' hashes, which varied with the build tree's path.
    shutil.rmtree(target / "bin", ignore_errors=True)
    for record in target.glob("*.dist-info/RECORD"):
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith("bin/")))
    for cache in target.rglob("__pycache__"):
        shutil.rmtree(cache)
    # uv's cache stamp (a timestamp) and the wheel's build path vary between builds and machines.
    for unstable in [*target.glob("*.dist-info/uv_cache.json"), *target.glob("*.dist-info/direct_url.json")]:
        unstable.unlink()
        record = unstable.parent / "RECORD"
        listed = f"{unstable.parent.name}/{unstable.name},"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith(listed)))
    _strip(target)


def _strip(target: Path) -> None:
    """Remove debug symbols from the wheels' shared objects (some ship them: 171 -> 129 MiB for agentk).

    ``strip --strip-unneeded`` keeps what the dynamic loader needs and is deterministic. It writes a new file
    that replaces the old one, so a file hard-linked elsewhere is never modified in place.
    """
    for path in sorted(target.rglob("*.so*")):
        if path.is_symlink() or not path.is_file() or path.read_bytes()[:4] != b"\x7fELF":
            continue
        stripped = path.with_name(path.name + ".stripped")
        run(["strip", "--strip-unneeded", "-o", str(stripped), str(path)], "strip (binutils)")
        stripped.chmod(stat.S_IMODE(path.stat().st_mode))
        stripped.replace(path)


def _extra_files(python: bool) -> dict[str, tuple[int, bytes]]:
    """Files the image adds besides packages: ``path -> (mode, content)``; the launcher only with Python."""
    launcher = (
        "#!/usr/bin/python3.11\n"
        "# Tether's console script (the wheel's [project.scripts] entry point).\n"
        "import sys\n\nfrom tether.cli import main\n\nsys.exit(main())\n"
    )
    return {
        **({LAUNCHER: (0o755, launcher.encode())} if python else {}),
        "etc/passwd": (0o644, f"root:x:0:0::/root:/nonexistent\nnonroot:x:{UID}:{UID}::/tmp:/nonexistent\n".encode()),
        "etc/group": (0o644, f"root:x:0:\nnonroot:x:{UID}:\n".encode()),
        "etc/nsswitch.conf": (0o644, b"passwd: files\ngroup: files\nhosts: files dns\n"),
    }


def _ca_bundle(rootfs: Path) -> bytes:
    """What ``update-ca-certificates`` would write: Debian's Mozilla certificates concatenated in name order."""
    certs = sorted((rootfs / "usr/share/ca-certificates/mozilla").glob("*.crt"))
    if not certs:
        raise ImageBuildError("no certificates under usr/share/ca-certificates/mozilla in the base rootfs")
    return b"".join(c.read_bytes().rstrip(b"\n") + b"\n" for c in certs)


def stage(base: Path, site: Path | None, out: Path) -> None:
    """Assemble the image's root filesystem in ``out`` (a fresh directory): base, packages, extra files.

    ``site`` holds the Python packages; None for an image without Python (the front proxy), which also gets
    no launcher and no CA bundle. The Containerfile's build stage gets the same through :func:`stage_rootfs`
    (``--rootfs-dir``).
    """
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(base, out, symlinks=True)
    shutil.rmtree(out / "var/cache/apt", ignore_errors=True)
    if site is not None:
        shutil.copytree(site, out / SITE_PACKAGES, symlinks=True, dirs_exist_ok=True)
    for rel, (mode, content) in _extra_files(site is not None).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    # Mount points must exist in the image: a read-only root cannot get them created at start.
    for mount_point in ("dev", "proc", "sys", "run", "tmp"):
        (out / mount_point).mkdir(exist_ok=True)
    (out / "tmp").chmod(0o1777)
    if site is None:
        return
    bundle = out / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(_ca_bundle(out))
    # OpenSSL's default paths (Debian's ``openssl`` package links them; that package and its CLI stay out).
    ssl_dir = out / "usr/lib/ssl"
    ssl_dir.mkdir(parents=True, exist_ok=True)
    (ssl_dir / "cert.pem").symlink_to("/etc/ssl/certs/ca-certificates.crt")
    (ssl_dir / "certs").symlink_to("/etc/ssl/certs")


# --- 3. layer and OCI archive ------------------------------------------------------------------------------


def _layer_tar(root: Path, out: Path, epoch: int) -> int:
    try:
        return reproducible_tar(root, out, epoch)
    except ValueError as exc:
        raise ImageBuildError(str(exc)) from exc


def _labels(spec: ImageSpec, epoch: int, source_digest: str) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": f"tether-{spec.name}",
        "org.opencontainers.image.description": spec.description,
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.licenses": "MIT",
        "org.opencontainers.image.created": datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.opencontainers.image.revision": source_digest,
        "org.opencontainers.image.base.name": f"debian:{DEBIAN_SUITE}",
    }


def _oci_archive(spec: ImageSpec, layer: Path, work: Path, out: Path, epoch: int, source_digest: str) -> str:
    """Make the OCI layout with umoci and pack it into ``out``; return the manifest digest."""
    layout = work / "layout"
    shutil.rmtree(layout, ignore_errors=True)
    image = f"{layout}:{__version__}"
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    run(["umoci", "init", "--layout", str(layout)], "umoci init")
    run(["umoci", "new", "--image", image], "umoci new")
    run(["umoci", "raw", "add-layer", "--no-history", "--image", image, str(layer)], "umoci raw add-layer")
    config = ["umoci", "config", "--no-history", "--image", image, "--created", created, "--author", "Tether"]
    config += ["--architecture", "amd64", "--os", "linux", "--config.user", f"{UID}:{UID}", "--config.workingdir", "/"]
    config += [f"--config.entrypoint={arg}" for arg in spec.entrypoint]
    config += [f"--config.env={k}={v}" for k, v in spec.env.items()]
    config += [f"--config.label={k}={v}" for k, v in _labels(spec, epoch, source_digest).items()]
    run(config, "umoci config")
    run(["umoci", "gc", "--layout", str(layout)], "umoci gc")
    index = json.loads((layout / "index.json").read_text())
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ImageBuildError(f"umoci left {len(manifests)} manifests in {layout}, expected one")
    # containerd and skopeo read the full reference from this annotation (deployment.md §1).
    manifests[0]["annotations"] = {"org.opencontainers.image.ref.name": spec.reference}
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True, separators=(",", ":")))
    _layer_tar(layout, out, epoch)
    return str(manifests[0]["digest"])


# --- 4. driver -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _exclusive(lock_path: Path, progress: Progress) -> Iterator[None]:
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"images: another image build is running; waiting for it ({lock_path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def images_dir() -> Path:
    """Where built images are cached: ``<cache>/images`` (``~/.cache/tether/images``)."""
    return cache_root() / "images"


def build_images(
    names: Sequence[str] = tuple(IMAGES), force: bool = False, progress: Progress = print
) -> list[BuiltImage]:
    """Build (or reuse) the images ``names`` and return them, in that order.

    An image is rebuilt when its key changed: the wheel's digest (the sources), its locked requirements,
    the base rootfs (Debian package list), this module and ``SOURCE_DATE_EPOCH``. The same inputs give the
    same digest (``tests/deploy/test_images.py`` builds twice).

    Raises:
        ImageBuildError: unknown image name, missing tool (mmdebstrap, umoci, dpkg-deb, uv), failed step.
    """
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        raise ImageBuildError(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    if os.geteuid() != 0:
        raise ImageBuildError("building images needs root (mmdebstrap --mode=root writes files owned by root)")
    root = _repo_root()
    cache = images_dir()
    cache.mkdir(parents=True, exist_ok=True)
    epoch = _epoch()
    built: list[BuiltImage] = []
    with _exclusive(cache / ".build.lock", progress):
        work = cache / "work"
        wheel: Path | None = None
        if any(IMAGES[name].python for name in names):
            wheel = _wheel(root, work / "wheel")
        wheel_digest = _digest_file(wheel) if wheel is not None else ""
        for name in names:
            spec = IMAGES[name]
            base, python_version = base_rootfs(cache, epoch, progress, spec.packages)
            requirements = _requirements(root, spec.extra) if spec.python else ""
            inputs: list[object] = [base.name, _recipe_digest(), epoch, spec.reference]
            if spec.python:
                inputs = [wheel_digest, requirements, *inputs]
            key = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()
            target = cache / name
            record = target / "image.json"
            if not force and record.is_file():
                saved = json.loads(record.read_text())
                archive = target / saved["archive"]
                if saved.get("key") == key and archive.is_file():
                    progress(f"images: {spec.reference} is cached ({saved['digest']})")
                    built.append(_built(name, target, saved, cached=True))
                    continue
            progress(f"images: building {spec.reference}")
            started = time.monotonic()
            site: Path | None = None
            if spec.python and wheel is not None:
                req_file = work / f"requirements-{name}.txt"
                req_file.write_text(requirements)
                site = work / f"site-{name}"
                _install_site(site, req_file, wheel, python_version)
            rootfs = work / f"rootfs-{name}"
            stage(base, site, rootfs)
            layer = work / f"layer-{name}.tar"
            size = _layer_tar(rootfs, layer, epoch)
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            archive_name = f"tether-{name}-{__version__}.oci.tar"
            # The revision label: the wheel's digest, or the recipe's for an image without Tether's code (never
            # the wheel's there: the image would then change with the sources it does not contain).
            revision = wheel_digest[:12] if spec.python else hashlib.sha256(_recipe_digest().encode()).hexdigest()[:12]
            digest = _oci_archive(spec, layer, work, target / archive_name, epoch, revision)
            compressed = _layer_blob_size(work / "layout")
            saved = {
                "key": key,
                "archive": archive_name,
                "reference": spec.reference,
                "digest": digest,
                "uncompressed_bytes": size,
                "compressed_bytes": compressed,
                "build_seconds": round(time.monotonic() - started, 1),
            }
            record.write_text(json.dumps(saved, indent=2))
            for leftover in (*([site] if site else []), rootfs, layer, work / "layout"):
                shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink()
            progress(f"images: {spec.reference} {digest} ({size / 2**20:.1f} MiB, {saved['build_seconds']}s)")
            built.append(_built(name, target, saved, cached=False))
    return built


def stage_rootfs(names: Sequence[str], out: Path, progress: Progress = print) -> None:
    """Write each image's root filesystem to ``out/<name>/`` without packing it (the Containerfile's build stage).

    Raises:
        ImageBuildError: as :func:`build_images`.
    """
    root = _repo_root()
    cache = Path(tempfile.mkdtemp(prefix="tether-images-"))
    try:
        wheel = _wheel(root, cache / "wheel") if any(IMAGES[name].python for name in names) else None
        for name in names:
            spec = IMAGES[name]
            base, python_version = base_rootfs(cache, _epoch(), progress, spec.packages)
            site: Path | None = None
            if spec.python and wheel is not None:
                requirements = cache / f"requirements-{name}.txt"
                requirements.write_text(_requirements(root, spec.extra))
                site = cache / f"site-{name}"
                _install_site(site, requirements, wheel, python_version)
            stage(base, site, out / name)
            progress(f"images: {name} root filesystem in {out / name}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _recipe_digest() -> str:
    """Digest of the build recipe: this module and its two helpers."""
    here = Path(__file__).parent
    return "".join(_digest_file(here / name) for name in ("images.py", "image_rootfs.py", "image_tar.py"))


def _layer_blob_size(layout: Path) -> int:
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((layout / "blobs/sha256" / manifest_digest).read_text())
    return sum(int(layer["size"]) for layer in manifest["layers"])


def _built(name: str, target: Path, saved: dict[str, object], cached: bool) -> BuiltImage:
    return BuiltImage(
        name=name,
        archive=target / str(saved["archive"]),
        reference=str(saved["reference"]),
        digest=str(saved["digest"]),
        uncompressed_bytes=int(str(saved["uncompressed_bytes"])),
        compressed_bytes=int(str(saved["compressed_bytes"])),
        cached=cached,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tether_devenv.images [--force] [NAME...]`` (``make images``): build and print the images."""
    parser = argparse.ArgumentParser(prog="python -m tether_devenv.images", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(IMAGES), help=f"images to build (default: {' '.join(IMAGES)})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    parser.add_argument("--json", action="store_true", help="print one JSON object per image (progress on stderr)")
    parser.add_argument("--rootfs-dir", type=Path, help="only write each root filesystem to DIR/<name> (Containerfile)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in IMAGES]
    if unknown:
        parser.error(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    try:
        if args.rootfs_dir is not None:
            stage_rootfs(args.names, args.rootfs_dir)
            return 0
        for image in build_images(args.names, force=args.force, progress=_stderr if args.json else print):
            if args.json:
                print(json.dumps({**dataclasses.asdict(image), "archive": str(image.archive)}))
            else:
                size = image.uncompressed_bytes / 2**20
                print(f"{image.reference}\t{image.digest}\t{size:.1f} MiB\t{image.archive}")
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
