"""Build the Kubernetes test-environment binaries from upstream Go modules, once per machine.

Recipe (``../shared/reference/k8s_testenv.md`` §2-4): ``k8s.io/kubernetes`` cannot be ``go install``-ed
because its go.mod replaces every staging module with a local path, so a throw-away wrapper module
replaces each staging module with its published ``v0.<minor>.<patch>`` instead. etcd's server module has
the same problem and gets its own wrapper; kwok gets a third one because it pins newer k8s libraries.

Each component is built into ``<cache>/k8s/.partial-v<version>/`` and the directory is renamed into
place only when every binary runs, so an interrupted build resumes and a half-built cache is never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tether_devenv.assets import (
    ETCD_VERSION,
    K8S_VERSION,
    KWOK_STAGE_FILES,
    KWOK_VERSION,
    MANIFEST,
    cache_dir,
    cache_problem,
    expected_manifest,
)

Progress = Callable[[str], None]
MIN_GO = (1, 24)
_K8S_CMDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


class BuildError(RuntimeError):
    """A build step failed; the message says what to install or fix and shows the tool's output tail."""


@dataclass
class _Runner:
    """Runs go commands with the build environment, reporting progress and keeping an output tail."""

    env: dict[str, str]
    progress: Progress
    heartbeat_s: float = 20.0
    retry_hint: str = "re-running `tether dev cluster build` resumes from the last finished component."

    def run(self, args: Sequence[str], cwd: Path, label: str, count_lines: bool = False) -> str:
        """Run ``args`` in ``cwd``; return stdout. Raises :class:`BuildError` with the output tail."""
        started = time.monotonic()
        last_beat = started
        tail: deque[str] = deque(maxlen=40)
        out: list[str] = []
        proc = subprocess.Popen(
            list(args), cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        # A reader thread lets the heartbeat keep ticking through long silent phases (module downloads).
        lines: queue.Queue[str | None] = queue.Queue()
        stream = proc.stdout

        def pump() -> None:
            for text in stream:
                lines.put(text)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                out.append(line)
                tail.append(line.rstrip())
            now = time.monotonic()
            if now - last_beat >= self.heartbeat_s:
                last_beat = now
                what = f"{len(out)} packages compiled" if count_lines else "working"
                self.progress(f"  {label}: {what} ({now - started:.0f}s)")
        code = proc.wait()
        if code != 0:
            shown = "\n    ".join(tail)
            raise BuildError(
                f"{label} failed (exit {code}) running: {' '.join(args)}\n    {shown}\n"
                "Check that the Go module proxy is reachable (GOPROXY) and that there is enough disk space; "
                + self.retry_hint
            )
        return "".join(out)


def _check_go(progress: Progress) -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "The Go toolchain is not installed (no `go` on PATH). Building the Kubernetes test binaries needs "
            f"Go >= {MIN_GO[0]}.{MIN_GO[1]}: install it (the go.dev tarball, or a distribution package recent "
            "enough), or set KUBEBUILDER_ASSETS / TEST_ASSET_* to existing binaries instead."
        )
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    match = re.match(r"go(\d+)\.(\d+)", version)
    if not match or (int(match[1]), int(match[2])) < MIN_GO:
        raise BuildError(f"{go} is {version or 'of unknown version'}; Go >= {MIN_GO[0]}.{MIN_GO[1]} is required.")
    progress(f"using {go} ({version})")
    return go


def _version_ldflags() -> str:
    minor = K8S_VERSION.split(".")[1]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion=v{K8S_VERSION}",
            f"-X {pkg}.gitMajor=1",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={stamp}",
        ]
    return " ".join(flags)


def _fresh_module(go: str, run: _Runner, work: Path, name: str) -> None:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run.run([go, "mod", "init", name], work, f"{name}: go mod init")


def _build_kubernetes(go: str, run: _Runner, work: Path, out: Path, commands: Sequence[str] = _K8S_CMDS) -> None:
    """Build ``k8s.io/kubernetes/cmd/<command>`` for each of ``commands`` in a wrapper module into ``out``.

    The real node's kubelet and kube-proxy (:mod:`tether_devenv.node_build`) come from here too, so every
    Kubernetes binary is built from the same module at the same version.
    """
    _fresh_module(go, run, work, "local/k8sbin")
    run.run([go, "mod", "edit", "-godebug=default=go1.24"], work, "kubernetes: godebug")
    info = json.loads(
        run.run([go, "mod", "download", "-json", f"k8s.io/kubernetes@v{K8S_VERSION}"], work, "kubernetes: fetch go.mod")
    )
    staging = re.findall(r"^\s*(k8s\.io/[a-z0-9-]+) => \./staging/", Path(info["GoMod"]).read_text(), re.M)
    run.progress(f"  kubernetes: replacing {len(staging)} staging modules with v0.{K8S_VERSION.split('.', 1)[1]}")
    minor_patch = K8S_VERSION.split(".", 1)[1]
    run.run([go, "mod", "edit", *[f"-replace={m}={m}@v0.{minor_patch}" for m in staging]], work, "kubernetes: replaces")
    pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in commands]
    run.run([go, "get", *[f"{p}@v{K8S_VERSION}" for p in pkgs]], work, "kubernetes: go get (module download)")
    run.run(
        [go, "build", "-v", "-p", "2", "-trimpath", "-ldflags", _version_ldflags(), "-o", f"{out}/", *pkgs],
        work,
        "kubernetes: go build",
        count_lines=True,
    )


def _build_wrapped(go: str, run: _Runner, work: Path, out: Path, name: str, package: str, version: str) -> None:
    """Build one main ``package`` at ``version`` in its own wrapper module into ``out/name``."""
    _fresh_module(go, run, work, f"local/{name}bin")
    run.run([go, "get", f"{package}@v{version}"], work, f"{name}: go get")
    run.run(
        [go, "build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", str(out / name), package],
        work,
        f"{name}: go build",
        count_lines=True,
    )


def _build_etcd(go: str, run: _Runner, work: Path, out: Path) -> None:
    # The server module's go.mod replaces its siblings with local paths, hence the wrapper (§4).
    _build_wrapped(go, run, work, out, "etcd", "go.etcd.io/etcd/server/v3", ETCD_VERSION)


def _build_kwok(go: str, run: _Runner, work: Path, out: Path) -> None:
    _build_wrapped(go, run, work, out, "kwok", "sigs.k8s.io/kwok/cmd/kwok", KWOK_VERSION)
    info = json.loads(
        run.run([go, "mod", "download", "-json", f"sigs.k8s.io/kwok@v{KWOK_VERSION}"], work, "kwok: stages")
    )
    source = Path(info["Dir"]) / "kustomize" / "stage"
    for stage in KWOK_STAGE_FILES:
        target = out / "stages" / stage
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / stage, target)


_STEPS: tuple[tuple[str, tuple[str, ...], Callable[[str, _Runner, Path, Path], None]], ...] = (
    ("etcd", ("etcd",), _build_etcd),
    ("kwok", ("kwok",), _build_kwok),
    ("kubernetes", _K8S_CMDS, _build_kubernetes),
)


def _verify(out: Path) -> None:
    for name, flag in [("etcd", "--version"), ("kwok", "--version"), ("kubectl", "version")]:
        args = [str(out / name), flag] + (["--client"] if name == "kubectl" else [])
        result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
        if result.returncode != 0:
            raise BuildError(f"built {name} does not run: {result.stderr.strip() or result.stdout.strip()}")
    for name in _K8S_CMDS[:3]:
        result = subprocess.run([str(out / name), "--version"], capture_output=True, text=True, check=False, timeout=60)
        if f"v{K8S_VERSION}" not in result.stdout:
            raise BuildError(
                f"built {name} reports {result.stdout.strip() or result.stderr.strip()!r}, expected v{K8S_VERSION}"
            )


@contextlib.contextmanager
def _exclusive(lock_path: Path, progress: Progress) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (released when the process ends, even by a crash)."""
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another build of the Kubernetes test binaries is running; waiting for it ({lock_path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) the cached binaries and return their directory.

    Idempotent: with a complete cache for the pinned versions it returns at once unless ``force``.
    Components already built by an interrupted run are kept. Total wall time per component is recorded
    in the manifest (``build_seconds``) for the benchmarks.

    Args:
        force: rebuild every component even if cached.
        progress: receives one human-readable line per event.

    Raises:
        BuildError: no or too old Go toolchain, or a failed step (with the output tail).
    """
    final = cache_dir()
    problem = cache_problem(final)
    if problem is None and not force:
        progress(f"Kubernetes test binaries are cached in {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Two builds sharing the partial directory corrupt each other: the second waits, then finds the cache.
    with _exclusive(final.parent / ".build.lock", progress):
        problem = cache_problem(final)
        if problem is None and not force:
            progress(f"Kubernetes test binaries are cached in {final}")
            return final
        versions = f"Kubernetes v{K8S_VERSION}, etcd v{ETCD_VERSION}, kwok v{KWOK_VERSION}"
        progress(f"building {versions} into {final} ({problem or 'forced'})")
        go = _check_go(progress)
        partial = final.parent / f".partial-{final.name}"
        if force:
            shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "auto"))
        runner = _Runner(env=env, progress=progress)
        timings: dict[str, float] = {}
        timings_file = partial / "timings.json"
        if timings_file.is_file():
            timings = json.loads(timings_file.read_text())
        for label, outputs, step in _STEPS:
            if all((partial / o).is_file() for o in outputs) and label in timings:
                progress(f"[{label}] already built")
                continue
            progress(f"[{label}] building {', '.join(outputs)}")
            started = time.monotonic()
            step(go, runner, final.parent / "work" / label, partial)
            timings[label] = round(time.monotonic() - started, 1)
            timings_file.write_text(json.dumps(timings))
            progress(f"[{label}] done in {timings[label]:.0f}s")
        _verify(partial)
        manifest = dict(expected_manifest(), build_seconds=timings)
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
        timings_file.unlink()
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        shutil.rmtree(final.parent / "work", ignore_errors=True)
        progress(f"Kubernetes test binaries ready in {final} (build {sum(timings.values()):.0f}s)")
        return final
