"""Build Jaeger from its Go module once per machine, cached beside the Kubernetes binaries (issue 25 item 3).

The trace collector of the tracing test (``tests/e2e/test_tracing.py``): it receives OTLP from the hub, kas and
agentk, keeps the spans in memory and answers queries over its HTTP API. ``go build
github.com/jaegertracing/jaeger/cmd/jaeger`` (Jaeger v2, an OpenTelemetry Collector distribution; module
version v1.76.0, ``../shared/reference/deployment.md`` §1) in a throw-away wrapper module (the recipe of
``build.py``) into ``<cache>/jaeger/v<version>/jaeger``. The binary is moved into place only once it runs, so
an interrupted build is never used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tether_devenv.assets import cache_root
from tether_devenv.build import BuildError, Progress, _check_go, _exclusive, _fresh_module, _Runner

__all__ = ["JAEGER_VERSION", "build_jaeger", "jaeger_path"]

#: ``github.com/jaegertracing/jaeger`` module version (``../shared/reference/deployment.md`` §1).
JAEGER_VERSION = "1.76.0"
_PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"


def jaeger_path() -> Path:
    """Where the cached Jaeger binary lives: ``<cache>/jaeger/v1.76.0/jaeger`` (it may not exist yet)."""
    return cache_root() / "jaeger" / f"v{JAEGER_VERSION}" / "jaeger"


def _runs(binary: Path) -> bool:
    # The manifest is written last: a binary without it is the leftover of an interrupted build.
    if not (binary.parent / "manifest.json").is_file():
        return False
    return _answers_help(binary)


def _answers_help(binary: Path) -> bool:
    try:
        result = subprocess.run([str(binary), "--help"], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def build_jaeger(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) Jaeger and return its path.

    Raises:
        BuildError: no or too old Go toolchain, or a failed ``go`` step (with the output tail).
    """
    final = jaeger_path()
    if not force and _runs(final):
        progress(f"jaeger v{JAEGER_VERSION} is cached in {final.parent}")
        return final
    final.parent.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(final.parent.parent / ".build.lock", progress):
        if not force and _runs(final):
            return final
        progress(f"building jaeger v{JAEGER_VERSION} from its Go module into {final.parent}")
        go = _check_go(progress)
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "auto"))
        runner = _Runner(env=env, progress=progress, retry_hint="re-running `make bootstrap` builds it again.")
        work = final.parent.parent / "work"
        _fresh_module(go, runner, work, "local/jaegerbin")
        runner.run([go, "get", f"{_PACKAGE}@v{JAEGER_VERSION}"], work, "jaeger: go get")
        partial = final.parent.parent / f".partial-jaeger-{JAEGER_VERSION}"
        runner.run(
            [go, "build", "-v", "-p", "2", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), _PACKAGE],
            work,
            "jaeger: go build",
            count_lines=True,
        )
        if not _answers_help(partial):
            raise BuildError(f"the jaeger built in {partial} does not start")
        final.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(final)
        (final.parent / "manifest.json").write_text(json.dumps({"jaeger": JAEGER_VERSION}))
        shutil.rmtree(work, ignore_errors=True)
        progress(f"jaeger v{JAEGER_VERSION} ready in {final}")
        return final


if __name__ == "__main__":
    try:
        build_jaeger(force="--force" in sys.argv[1:])
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
