"""Build upstream GitLab kas, agentk and glab once per machine, as interop test peers.

The Go module proxy refuses ``gitlab.com/...`` modules, so the sources come as tarballs in
``../shared/upstream/`` beside the repository (its README gives the versions and this recipe): the agent
tarball is unpacked, patched with the build patch that drops three agentk modules with unreachable
dependencies, and ``cmd/kas`` and ``cmd/agentk`` are built; glab is built from its own tarball. Their
dependencies come from the Go module proxy.

Binaries land in ``<cache>/upstream/<version>/`` (``kas``, ``agentk``, ``glab``, ``manifest.json``). Each
component is built into a ``.partial-`` sibling that is renamed into place only once every binary runs,
so an interrupted build resumes and a half-built cache is never used; a component whose recipe and sources
did not change is taken from the stale cache instead of being built again (kas and agentk take about 18
minutes on 2 cores). Versions are stamped as upstream's own builds stamp them (``-X`` ldflags), so ``glab
version`` prints ``glab 1.72.0 (294f0726)`` as a released glab does. No upstream code enters the repo.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tether_devenv.assets import cache_root, manifest_problem
from tether_devenv.build import BuildError, Progress, _check_go, _Runner

AGENT_COMMIT = "8daa08cc"
AGENT_VERSION = f"v16.5.0-{AGENT_COMMIT}"
GLAB_VERSION = "v1.72.0"
#: The commit of glab's tag (../shared/upstream/README.md); glab's Makefile stamps its short form.
GLAB_COMMIT = "294f0726"
#: What ``glab version`` prints when built as glab's Makefile and .goreleaser.yml build it.
GLAB_STAMP = f"glab {GLAB_VERSION.removeprefix('v')} ({GLAB_COMMIT})"
AGENT_TARBALL = f"gitlab-agent-{AGENT_COMMIT}.tar.gz"
AGENT_PATCH = f"gitlab-agent-{AGENT_COMMIT}-build.patch"
GLAB_TARBALL = f"glab-{GLAB_VERSION}.tar.gz"
AGENT_MODULE = "gitlab.com/gitlab-org/cluster-integration/gitlab-agent/v16"
BINARIES: tuple[str, ...] = ("kas", "agentk", "glab")
MANIFEST = "manifest.json"
_RETRY = "re-running `tether dev upstream build` resumes from the last finished component."


def sources_dir() -> Path:
    """Return the folder holding the upstream tarballs.

    ``$TETHER_UPSTREAM_SOURCES`` when set, else ``../shared/upstream`` relative to the repository root
    (CI clones the repository with ``../shared`` beside it).
    """
    explicit = os.environ.get("TETHER_UPSTREAM_SOURCES")
    if explicit:
        return Path(explicit)
    return Path(__file__).resolve().parents[3].parent / "shared" / "upstream"


def cache_dir() -> Path:
    """Return the cache directory for the pinned versions, e.g. ``~/.cache/tether/upstream/v16.5.0-8daa08cc``."""
    return cache_root() / "upstream" / f"{AGENT_VERSION}_glab-{GLAB_VERSION}"


def expected_manifest() -> dict[str, str]:
    """Return the versions a complete upstream cache records in its manifest.

    ``glab_stamp`` is what the built glab prints: a cache from before glab was stamped lacks it, and only
    glab is built again (:func:`build` reuses kas and agentk).
    """
    return {"gitlab_agent": AGENT_VERSION, "glab": GLAB_VERSION, "glab_stamp": GLAB_STAMP}


def cache_problem(directory: Path | None = None) -> str | None:
    """Explain why the upstream cache at ``directory`` is unusable, or return None when it is complete."""
    directory = directory or cache_dir()
    return manifest_problem(directory, expected_manifest(), BINARIES, "upstream ")


@dataclass(frozen=True)
class UpstreamBinaries:
    """Paths of the built upstream programs (each an absolute path to an executable)."""

    kas: Path
    agentk: Path
    glab: Path


def locate() -> UpstreamBinaries:
    """Return the cached upstream binaries.

    Raises:
        BuildError: when the cache is incomplete, naming the command that builds it.
    """
    directory = cache_dir()
    problem = cache_problem(directory)
    if problem is not None:
        raise BuildError(f"upstream test peers not built: {problem}. Build them with `tether dev upstream build`.")
    return UpstreamBinaries(kas=directory / "kas", agentk=directory / "agentk", glab=directory / "glab")


def _source(name: str) -> Path:
    path = sources_dir() / name
    if not path.is_file():
        raise BuildError(
            f"upstream source {path} not found. The upstream tarballs live in ../shared/upstream beside the "
            "repository; set TETHER_UPSTREAM_SOURCES to the folder holding them."
        )
    return path


def _unpack(tarball: Path, work: Path, top: str) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(work, filter="data")
    tree = work / top
    if not tree.is_dir():
        raise BuildError(f"{tarball} does not contain the folder {top}/")
    return tree


def _build_agent(go: str, run: _Runner, work: Path, out: Path) -> None:
    tree = _unpack(_source(AGENT_TARBALL), work, f"gitlab-agent-{AGENT_COMMIT}")
    run.run(["git", "apply", "-p1", str(_source(AGENT_PATCH))], tree, "gitlab-agent: apply build patch")
    run.run(
        [
            go,
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            f"-s -w -X {AGENT_MODULE}/cmd.Version={AGENT_VERSION} -X {AGENT_MODULE}/cmd.Commit={AGENT_COMMIT}",
            "-o",
            f"{out}/",
            "./cmd/kas",
            "./cmd/agentk",
        ],
        tree,
        "gitlab-agent: go build kas agentk",
        count_lines=True,
    )


def _build_glab(go: str, run: _Runner, work: Path, out: Path) -> None:
    tree = _unpack(_source(GLAB_TARBALL), work, f"glab-{GLAB_VERSION}")
    # glab's Makefile: -X main.commit=<short sha> -X main.version=<tag>; `glab version` trims the "v".
    ldflags = f"-s -w -X main.version={GLAB_VERSION} -X main.commit={GLAB_COMMIT}"
    run.run(
        [go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(out / "glab"), "./cmd/glab"],
        tree,
        "glab: go build",
        count_lines=True,
    )


@dataclass(frozen=True)
class _Step:
    """One upstream component to build.

    Attributes:
        label: its name in progress lines and ``build_seconds``.
        outputs: the binaries it makes.
        build: ``(go, runner, work folder, output folder)`` -> builds them.
        manifest_keys, sources: what a cached copy must match to be reused (see :func:`reusable`).
    """

    label: str
    outputs: tuple[str, ...]
    build: Callable[[str, _Runner, Path, Path], None]
    manifest_keys: tuple[str, ...]
    sources: tuple[str, ...]


_STEPS: tuple[_Step, ...] = (
    _Step("gitlab-agent", ("kas", "agentk"), _build_agent, ("gitlab_agent",), (AGENT_TARBALL, AGENT_PATCH)),
    _Step("glab", ("glab",), _build_glab, ("glab", "glab_stamp"), (GLAB_TARBALL,)),
)


def reusable(directory: Path, step: _Step, source_digests: dict[str, str]) -> float | None:
    """How long ``step`` took to build, when the (possibly stale) cache at ``directory`` holds reusable binaries.

    Reusable: the manifest records the step's current values (``manifest_keys``) and the SHA-256 of its
    source tarballs (``source_digests``: name -> digest), and its binaries are executable files.

    Returns:
        the recorded build seconds (0.0 if none recorded), or None when the step must be built.
    """
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    want = expected_manifest()
    if any(manifest.get(key) != want[key] for key in step.manifest_keys):
        return None
    recorded = manifest.get("sources") or {}
    if any(recorded.get(name) != source_digests[name] for name in step.sources):
        return None
    if not all((directory / o).is_file() and os.access(directory / o, os.X_OK) for o in step.outputs):
        return None
    seconds = (manifest.get("build_seconds") or {}).get(step.label)
    return float(seconds) if isinstance(seconds, int | float) else 0.0


def _verify(out: Path) -> None:
    # glab looks for a newer release on gitlab.com, and prints the failure, when it has not done so that day;
    # a machine without internet access always fails, so the check is turned off (its own variable).
    env = dict(os.environ, GLAB_CHECK_UPDATE="false")
    for name, args in (("kas", ["--version"]), ("agentk", ["--version"]), ("glab", ["version"])):
        result = subprocess.run(
            [str(out / name), *args], capture_output=True, text=True, check=False, timeout=60, env=env
        )
        text = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            raise BuildError(f"built upstream {name} does not run: {text}")
        if name == "glab" and text != GLAB_STAMP:
            raise BuildError(f"built upstream glab prints {text!r} for `glab version`, expected {GLAB_STAMP!r}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) upstream kas, agentk and glab; return the directory holding them.

    Idempotent: with a complete cache it returns at once unless ``force``. The manifest records the
    versions, the source tarballs' SHA-256 and per-component build seconds.

    Raises:
        BuildError: missing sources, no or too old Go toolchain, or a failed step (with the output tail).
    """
    final = cache_dir()
    problem = cache_problem(final)
    if problem is None and not force:
        progress(f"upstream kas, agentk and glab are cached in {final}")
        return final
    progress(
        f"building upstream kas/agentk {AGENT_VERSION} and glab {GLAB_VERSION} into {final} ({problem or 'forced'})"
    )
    sources = {name: _source(name) for name in (AGENT_TARBALL, AGENT_PATCH, GLAB_TARBALL)}
    digests = {name: _sha256(path) for name, path in sources.items()}
    go = _check_go(progress)
    partial = final.parent / f".partial-{final.name}"
    if force:
        shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        CGO_ENABLED="0",
        GOFLAGS="-buildvcs=false -mod=mod",
        GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "auto"),
    )
    runner = _Runner(env=env, progress=progress, retry_hint=_RETRY)
    timings_file = partial / "timings.json"
    timings: dict[str, float] = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    work_root = final.parent / f".work-{final.name}"
    built: dict[str, float] = {}  # this run's builds (timings also holds reused and resumed components)
    for step in _STEPS:
        label, outputs = step.label, step.outputs
        if all((partial / o).is_file() for o in outputs) and label in timings:
            progress(f"[{label}] already built")
            continue
        cached = None if force else reusable(final, step, digests)
        if cached is not None:
            for output in outputs:
                shutil.copy2(final / output, partial / output)
            timings[label] = cached
            timings_file.write_text(json.dumps(timings))
            progress(f"[{label}] unchanged: {', '.join(outputs)} taken from {final}")
            continue
        progress(f"[{label}] building {', '.join(outputs)}")
        started = time.monotonic()
        step.build(go, runner, work_root / label, partial)
        timings[label] = built[label] = round(time.monotonic() - started, 1)
        timings_file.write_text(json.dumps(timings))
        progress(f"[{label}] done in {timings[label]:.0f}s")
    _verify(partial)
    manifest = dict(expected_manifest(), sources=digests, build_seconds=timings)
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
    timings_file.unlink()
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    shutil.rmtree(work_root, ignore_errors=True)
    progress(f"upstream test peers ready in {final} (built in {sum(built.values()):.0f}s)")
    return final
