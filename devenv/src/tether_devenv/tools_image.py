"""The workspace tools-injector image: a self-contained editor copied into each workspace (issue 23 item 2).

GitLab injects its editor the same way (``../shared/reference/workspaces.md`` §4.2): an init container of the
tools-injector image copies the editor into the workspace's volume (``/projects/.gl-tools``) and the main
container starts it on port 60001, whatever the workspace image. Ours is JupyterLab (PyPI; ``code-server``
from npm does not install here: its install step fetches a dependency from a git host). So that any image
works (no Python, no shell, another libc), the copy carries everything it runs on:

- ``bin/python3.11``: Debian's interpreter from the images' base rootfs (``image_rootfs.py``), patched by
  ``patchelf`` to load ``/projects/.gl-tools/lib/ld-linux-x86-64.so.2`` and to find its libraries in
  ``$ORIGIN/../lib`` (DT_RPATH, which also serves the extension modules it loads). Nothing is set in the
  environment, so the user's programs started from the editor's terminal keep the image's own libraries.
- ``lib/``: glibc and the shared libraries of the base rootfs; ``lib/python3.11``: the standard library;
  ``lib/python3/dist-packages``: JupyterLab and its dependencies, pinned with hashes in
  ``workspace_tools/requirements.txt``, binary wheels only; ``share/jupyter`` and ``etc/jupyter``: their data.
- ``bin/gl-editor`` (starts the editor), ``bin/gl-tools-inject`` (the init container's copy step) and the
  ``gl_prefix`` server extension, from ``workspace_tools/``; ``.stamp``: the build key (a restart with the
  same image copies nothing).

Built as ``images.py`` builds the others (reproducible layer, umoci, OCI archive, cached under a key over every
input): ``python -m tether_devenv.tools_image`` (``make images``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from tether_devenv import images
from tether_devenv.image_rootfs import ImageBuildError, base_rootfs, run

__all__ = ["GL_TOOLS_DIR", "TOOLS_IMAGE", "build_tools_image", "main"]

#: Where the tools live in the workspace's volume (GitLab's ``GL_TOOLS_DIR``).
GL_TOOLS_DIR = "/projects/.gl-tools"
_IN_IMAGE = "gl-tools"
_LOADER = "ld-linux-x86-64.so.2"
_SOURCES = Path(__file__).parent / "workspace_tools"
_NOTIFICATIONS = "@jupyterlab/apputils-extension:notification"
#: The image: the init container runs the injector on the Python it ships (the image has no other).
TOOLS_IMAGE = images.ImageSpec(
    "workspace-tools",
    None,
    (f"/{_IN_IMAGE}/lib/{_LOADER}", f"/{_IN_IMAGE}/bin/python3.11", "-I", f"/{_IN_IMAGE}/bin/gl-tools-inject"),
    "Tether workspace tools injector: JupyterLab, copied into each workspace's volume",
)


def _key(base: Path, requirements: str, epoch: int) -> str:
    parts = [base.name, requirements, epoch, TOOLS_IMAGE.reference, images._recipe_digest()]
    parts += [images._digest_file(path) for path in sorted(_SOURCES.iterdir()) if path.is_file()]
    parts.append(images._digest_file(Path(__file__)))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


#: Installed as dependencies, never used by the editor's server or its terminals; left out (fewer files to copy
#: into each workspace): the debugger adapter, IPython's optional completion engine, setuptools.
_UNUSED = ("debugpy", "jedi", "parso", "setuptools", "_distutils_hack", "distutils-precedence.pth")


#: Within JupyterLab's package: its built application again (served from ``share/jupyter/lab``, only "core
#: mode" reads this copy) and its tests (its build configuration, ``staging``, is read at start).
_JUPYTERLAB_UNUSED = ("static", "tests")


def _prune(site: Path) -> None:
    """Drop what each workspace's first start would copy for nothing.

    :data:`_UNUSED` (packages and metadata), JupyterLab's :data:`_JUPYTERLAB_UNUSED`, and babel's locales but
    English (the UI ships in English).
    """
    for name in _JUPYTERLAB_UNUSED:
        shutil.rmtree(site / "jupyterlab" / name)
    for name in _UNUSED:
        for path in [site / name, *site.glob(f"{name}-*.dist-info")]:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for locale in (site / "babel/locale-data").glob("*.dat"):
        if locale.stem != "root" and not locale.stem.startswith("en"):
            locale.unlink()


def _compile(tools: Path) -> None:
    """Byte-compile the standard library and the packages (unchecked hashes: no timestamp, so reproducible).

    Without them the editor compiles hundreds of modules at each first start, a minute on a loaded machine.
    Paths in tracebacks are the runtime ones, under :data:`GL_TOOLS_DIR`.
    """
    python = [str(tools / "lib" / _LOADER), str(tools / "bin/python3.11"), "-I"]  # the copy's own interpreter
    for tree in ("lib/python3.11", "lib/python3/dist-packages"):
        run(
            [*python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
             "-s", str(tools), "-p", GL_TOOLS_DIR, str(tools / tree)],
            "compileall",
        )  # fmt: skip


def _stage(base: Path, site: Path, out: Path, key: str) -> None:
    """Lay out the image's root filesystem in ``out``: ``/gl-tools`` (the copy) and the mount points."""
    shutil.rmtree(out, ignore_errors=True)
    tools = out / _IN_IMAGE
    lib = tools / "lib"
    lib.mkdir(parents=True)
    for libdir in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"):
        shutil.copytree(base / libdir, lib, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(lib / "gconv")  # glibc's iconv modules: Python's codecs do not use them
    shutil.copytree(base / "usr/lib/python3.11", lib / "python3.11", symlinks=True)
    shutil.copytree(site, lib / "python3/dist-packages", symlinks=True)
    _prune(lib / "python3/dist-packages")
    # Wheels' data files (JupyterLab's built application, the server extensions' enabling configuration) land
    # beside the packages with ``--target``; Jupyter looks for them under ``sys.prefix``.
    for data in ("share", "etc"):
        shutil.move(lib / "python3/dist-packages" / data, tools / data)
    shutil.rmtree(tools / "share/man", ignore_errors=True)
    shutil.rmtree(tools / "share/applications", ignore_errors=True)
    shutil.rmtree(tools / "share/icons", ignore_errors=True)
    # No news or update checks: the workspace may have no internet, and the user did not ask.
    settings = tools / "share/jupyter/lab/settings"
    settings.mkdir(parents=True, exist_ok=True)
    quiet = {_NOTIFICATIONS: {"fetchNews": "false", "checkForUpdates": False}}
    (settings / "overrides.json").write_text(json.dumps(quiet))
    shutil.copy2(_SOURCES / "gl_prefix.py", lib / "python3/dist-packages/gl_prefix.py")
    (tools / "bin").mkdir()
    python = tools / "bin/python3.11"
    shutil.copy2(base / "usr/bin/python3.11", python)
    run(["patchelf", "--set-interpreter", f"{GL_TOOLS_DIR}/lib/{_LOADER}", str(python)], "patchelf (interpreter)")
    run(["patchelf", "--force-rpath", "--set-rpath", "$ORIGIN/../lib", str(python)], "patchelf (rpath)")
    for script in ("gl-editor", "gl-tools-inject"):
        shutil.copy2(_SOURCES / script, tools / "bin" / script)
        (tools / "bin" / script).chmod(0o755)
    _compile(tools)
    (tools / ".stamp").write_text(key + "\n")
    for mount_point in ("dev", "proc", "sys", "tmp", "projects"):
        (out / mount_point).mkdir()
    (out / "tmp").chmod(0o1777)


def build_tools_image(force: bool = False, progress: images.Progress = print) -> images.BuiltImage:
    """Build (or reuse from the cache) the tools-injector image; same inputs, same digest.

    Raises:
        ImageBuildError: a tool is missing (mmdebstrap, umoci, patchelf, uv) or a step failed.
    """
    if shutil.which("patchelf") is None:
        raise ImageBuildError("patchelf is not installed; `bash scripts/bootstrap.sh` installs it")
    cache = images.images_dir()
    cache.mkdir(parents=True, exist_ok=True)
    epoch = images._epoch()
    spec = TOOLS_IMAGE
    with images._exclusive(cache / ".build.lock", progress):
        base, python_version = base_rootfs(cache, epoch, progress)
        requirements = (_SOURCES / "requirements.txt").read_text()
        key = _key(base, requirements, epoch)
        target = cache / spec.name
        record = target / "image.json"
        if not force and record.is_file():
            saved = json.loads(record.read_text())
            if saved.get("key") == key and (target / saved["archive"]).is_file():
                progress(f"images: {spec.reference} is cached ({saved['digest']})")
                return images._built(spec.name, target, saved, cached=True)
        progress(f"images: building {spec.reference}")
        started = time.monotonic()
        work = cache / "work"
        work.mkdir(parents=True, exist_ok=True)
        site, rootfs, layer = work / "site-tools", work / "rootfs-tools", work / "layer-tools.tar"
        images._install_site(site, _SOURCES / "requirements.txt", None, python_version)
        _stage(base, site, rootfs, key)
        size = images._layer_tar(rootfs, layer, epoch)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        archive_name = f"tether-{spec.name}-{spec.reference.rsplit(':', 1)[1]}.oci.tar"
        digest = images._oci_archive(spec, layer, work, target / archive_name, epoch, key[:12])
        saved = {
            "key": key,
            "archive": archive_name,
            "reference": spec.reference,
            "digest": digest,
            "uncompressed_bytes": size,
            "compressed_bytes": images._layer_blob_size(work / "layout"),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        record.write_text(json.dumps(saved, indent=2))
        for leftover in (site, rootfs, work / "layout"):
            shutil.rmtree(leftover, ignore_errors=True)
        layer.unlink()
        progress(f"images: {spec.reference} {digest} ({size / 2**20:.1f} MiB, {saved['build_seconds']}s)")
        return images._built(spec.name, target, saved, cached=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m tether_devenv.tools_image [--force]``: build the image and print it."""
    parser = argparse.ArgumentParser(prog="python -m tether_devenv.tools_image", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    args = parser.parse_args(argv)
    try:
        image = build_tools_image(force=args.force)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{image.reference}\t{image.digest}\t{image.uncompressed_bytes / 2**20:.1f} MiB\t{image.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
