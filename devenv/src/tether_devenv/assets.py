"""Where the Kubernetes test-environment binaries live, and how they are found.

Lookup order per binary (the envtest convention, ``../shared/reference/k8s_testenv.md`` §5):

1. ``TEST_ASSET_<NAME>`` (e.g. ``TEST_ASSET_KUBE_APISERVER``) when it points at an existing file;
2. ``$KUBEBUILDER_ASSETS/<name>`` when that file exists;
3. Tether's per-machine cache, ``$TETHER_CACHE_DIR`` or ``~/.cache/tether``, under ``k8s/v<version>/``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = "1.34.4"
ETCD_VERSION = "3.6.16"
KWOK_VERSION = "0.8.0"

#: Binaries of the control plane plus the real ``kubectl`` client the tests and users drive.
COMPONENTS: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
)

#: kwok v0.8.0 has no built-in stages; these files are copied from its module next to the binaries.
KWOK_STAGE_FILES: tuple[str, ...] = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)

MANIFEST = "manifest.json"


def cache_root() -> Path:
    """Return Tether's per-machine cache directory (``$TETHER_CACHE_DIR`` or ``~/.cache/tether``)."""
    explicit = os.environ.get("TETHER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tether"


def cache_dir() -> Path:
    """Return the cache directory for the pinned Kubernetes version, e.g. ``~/.cache/tether/k8s/v1.34.4``."""
    return cache_root() / "k8s" / f"v{K8S_VERSION}"


def expected_manifest() -> dict[str, str]:
    """Return the versions a complete cache must record in its ``manifest.json``."""
    return {"kubernetes": K8S_VERSION, "etcd": ETCD_VERSION, "kwok": KWOK_VERSION}


@dataclass(frozen=True)
class Assets:
    """Resolved paths of every binary plus the kwok stage files.

    Attributes:
        binaries: component name (one of :data:`COMPONENTS`) to absolute path.
        stages: kwok stage YAML files, in the order of :data:`KWOK_STAGE_FILES`.
    """

    binaries: dict[str, Path]
    stages: tuple[Path, ...]

    def __getitem__(self, name: str) -> Path:
        return self.binaries[name]


class AssetsMissing(RuntimeError):
    """The binaries are not available: neither given by the envtest variables nor built into the cache."""


def _env_override(name: str) -> Path | None:
    var = "TEST_ASSET_" + name.upper().replace("-", "_")
    value = os.environ.get(var)
    if value and Path(value).is_file():
        return Path(value)
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / name).is_file():
        return Path(assets) / name
    return None


def manifest_problem(directory: Path, expected: dict[str, str], binaries: Sequence[str], kind: str = "") -> str | None:
    """Explain why a cached build in ``directory`` is unusable, or return None when it looks complete.

    Shared by the Kubernetes and the upstream caches: ``manifest.json`` must hold ``expected`` (versions)
    and every name in ``binaries`` must be an executable file. ``kind`` (e.g. ``"upstream "``) prefixes
    "build" and "cache" in the message.
    """
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return f"no complete {kind}build in {directory} (manifest.json missing)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable {manifest_path}: {exc}"
    stale = f"stale {kind}cache"
    for key, want in expected.items():
        if manifest.get(key) != want:
            return f"{stale} in {directory}: {key} is {manifest.get(key)!r}, expected {want!r}"
    for name in binaries:
        path = directory / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            return f"{stale} in {directory}: {name} is missing or not executable"
    return None


def cache_problem(directory: Path | None = None) -> str | None:
    """Explain why the cache at ``directory`` (default :func:`cache_dir`) is unusable, or return None.

    A cache is stale when its manifest records other versions or a binary or stage file is missing.
    """
    directory = directory or cache_dir()
    problem = manifest_problem(directory, expected_manifest(), COMPONENTS)
    if problem is not None:
        return problem
    for stage in KWOK_STAGE_FILES:
        if not (directory / "stages" / stage).is_file():
            return f"stale cache in {directory}: kwok stage {stage} is missing"
    return None


def locate() -> Assets:
    """Resolve every binary, preferring envtest variables, else the per-machine cache.

    Raises:
        AssetsMissing: naming what is missing and how to build it.
    """
    directory = cache_dir()
    problem = cache_problem(directory)
    binaries: dict[str, Path] = {}
    for name in COMPONENTS:
        path = _env_override(name) or (directory / name if problem is None else None)
        if path is None:
            raise AssetsMissing(
                f"Kubernetes test binary {name!r} not available: {problem}. "
                "Build the binaries once with `tether dev cluster build` (needs Go >= 1.24 and the Go "
                "module proxy), or point KUBEBUILDER_ASSETS / TEST_ASSET_* at existing binaries."
            )
        binaries[name] = path
    stages = tuple(directory / "stages" / s for s in KWOK_STAGE_FILES)
    if not all(s.is_file() for s in stages):
        raise AssetsMissing(f"kwok stage files missing under {directory / 'stages'}: run `tether dev cluster build`")
    return Assets(binaries=binaries, stages=stages)
