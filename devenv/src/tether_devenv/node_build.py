"""Build the real node's binaries from upstream Go modules, once per machine.

The development cluster's real node (:mod:`tether_devenv.node`) runs four programs that no Debian package
ships: kubelet and kube-proxy, built from the same ``k8s.io/kubernetes`` module and version as the control
plane (:func:`tether_devenv.build._build_kubernetes`, ``../shared/reference/deployment.md`` §1); CoreDNS for
cluster DNS (``github.com/coredns/coredns``, its go.mod has no replace directive, so a plain wrapper module
builds it); and local-path-provisioner for dynamic PersistentVolumes
(``github.com/rancher/local-path-provisioner``). containerd, runc and the CNI plugins come from Debian
(``scripts/bootstrap.sh``).

Binaries land in ``<cache>/node/v<kubernetes>/`` with a ``manifest.json``; like the control-plane cache, each
component is built into a ``.partial-`` sibling renamed into place once every binary runs, so an interrupted
build resumes and a half-built cache is never used. The steps run one after the other (two cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tether_devenv.assets import K8S_VERSION, MANIFEST, cache_root, manifest_problem
from tether_devenv.build import BuildError, Progress, _build_kubernetes, _build_wrapped, _check_go, _exclusive, _Runner

COREDNS_VERSION = "1.12.4"
LOCAL_PATH_VERSION = "0.0.30"
BINARIES: tuple[str, ...] = ("kubelet", "kube-proxy", "coredns", "local-path-provisioner")
_RETRY = "re-running `tether dev cluster build` resumes from the last finished component."


def cache_dir() -> Path:
    """Return the node binaries' cache directory, e.g. ``~/.cache/tether/node/v1.34.4``."""
    return cache_root() / "node" / f"v{K8S_VERSION}"


def expected_manifest() -> dict[str, str]:
    """Return the versions a complete node cache records in its manifest."""
    return {"kubernetes": K8S_VERSION, "coredns": COREDNS_VERSION, "local_path_provisioner": LOCAL_PATH_VERSION}


def cache_problem(directory: Path | None = None) -> str | None:
    """Explain why the node cache at ``directory`` is unusable, or return None when it is complete."""
    return manifest_problem(directory or cache_dir(), expected_manifest(), BINARIES, "real-node ")


@dataclass(frozen=True)
class NodeBinaries:
    """Absolute paths of the built node programs."""

    kubelet: Path
    kube_proxy: Path
    coredns: Path
    local_path_provisioner: Path


def locate() -> NodeBinaries:
    """Return the cached node binaries.

    Raises:
        BuildError: the cache is incomplete; the message names the command that builds it.
    """
    directory = cache_dir()
    problem = cache_problem(directory)
    if problem is not None:
        raise BuildError(f"real-node binaries not built: {problem}. Build them with `tether dev cluster build`.")
    return NodeBinaries(
        kubelet=directory / "kubelet",
        kube_proxy=directory / "kube-proxy",
        coredns=directory / "coredns",
        local_path_provisioner=directory / "local-path-provisioner",
    )


def _kubelet(go: str, run: _Runner, work: Path, out: Path) -> None:
    _build_kubernetes(go, run, work, out, ("kubelet",))


def _kube_proxy(go: str, run: _Runner, work: Path, out: Path) -> None:
    _build_kubernetes(go, run, work, out, ("kube-proxy",))


def _coredns(go: str, run: _Runner, work: Path, out: Path) -> None:
    _build_wrapped(go, run, work, out, "coredns", "github.com/coredns/coredns", COREDNS_VERSION)


def _local_path(go: str, run: _Runner, work: Path, out: Path) -> None:
    _build_wrapped(
        go, run, work, out, "local-path-provisioner", "github.com/rancher/local-path-provisioner", LOCAL_PATH_VERSION
    )


# Serial on purpose, heaviest first: kubelet, kube-proxy, coredns, local-path-provisioner.
_STEPS: tuple[tuple[str, Callable[[str, _Runner, Path, Path], None]], ...] = (
    ("kubelet", _kubelet),
    ("kube-proxy", _kube_proxy),
    ("coredns", _coredns),
    ("local-path-provisioner", _local_path),
)


def _verify(out: Path) -> None:
    checks = {
        "kubelet": (["--version"], f"v{K8S_VERSION}"),
        "kube-proxy": (["--version"], f"v{K8S_VERSION}"),
        "coredns": (["-version"], "CoreDNS-"),
        "local-path-provisioner": (["--version"], "version"),
    }
    for name, (args, expected) in checks.items():
        result = subprocess.run([str(out / name), *args], capture_output=True, text=True, check=False, timeout=60)
        text = (result.stdout + result.stderr).strip()
        if result.returncode != 0 or expected not in text:
            raise BuildError(f"built {name} does not run as expected ({expected!r} not in its output): {text}")


def build(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) kubelet, kube-proxy, CoreDNS and local-path-provisioner; return their directory.

    Idempotent: with a complete cache it returns at once unless ``force``. The manifest records the versions
    and per-component build seconds.

    Raises:
        BuildError: no or too old Go toolchain, or a failed step (with the output tail).
    """
    final = cache_dir()
    if cache_problem(final) is None and not force:
        progress(f"real-node binaries are cached in {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(final.parent / ".build.lock", progress):
        problem = cache_problem(final)
        if problem is None and not force:
            progress(f"real-node binaries are cached in {final}")
            return final
        progress(
            f"building kubelet and kube-proxy v{K8S_VERSION}, CoreDNS v{COREDNS_VERSION} and local-path-provisioner "
            f"v{LOCAL_PATH_VERSION} into {final} ({problem or 'forced'})"
        )
        go = _check_go(progress)
        partial = final.parent / f".partial-{final.name}"
        if force:
            shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "auto"))
        runner = _Runner(env=env, progress=progress, retry_hint=_RETRY)
        timings_file = partial / "timings.json"
        timings: dict[str, float] = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
        work_root = final.parent / f".work-{final.name}"
        for label, step in _STEPS:
            if (partial / label).is_file() and label in timings:
                progress(f"[{label}] already built")
                continue
            progress(f"[{label}] building")
            started = time.monotonic()
            step(go, runner, work_root / label, partial)
            timings[label] = round(time.monotonic() - started, 1)
            timings_file.write_text(json.dumps(timings))
            progress(f"[{label}] done in {timings[label]:.0f}s")
        _verify(partial)
        (partial / MANIFEST).write_text(json.dumps(dict(expected_manifest(), build_seconds=timings), indent=2))
        timings_file.unlink()
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        shutil.rmtree(work_root, ignore_errors=True)
        progress(f"real-node binaries ready in {final} (build {sum(timings.values()):.0f}s)")
        return final
