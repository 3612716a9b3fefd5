"""Build helm from its Go module once per machine, cached beside the Kubernetes binaries (issue 22 item 3).

``go build helm.sh/helm/v3/cmd/helm`` in a throw-away wrapper module (the recipe of ``build.py``), with the
version stamped the way helm's own Makefile does (``internal/version``), into
``<cache>/helm/v<version>/helm``. The binary is moved into place only once it runs, so an interrupted build
is never used. ``tests/deploy/test_charts.py`` lints and renders the charts with it.
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

__all__ = ["HELM_VERSION", "build_helm", "helm_path"]

#: ``helm.sh/helm/v3`` release (``../shared/reference/deployment.md`` §1).
HELM_VERSION = "3.22.0"
_PACKAGE = "helm.sh/helm/v3/cmd/helm"


def helm_path() -> Path:
    """Where the cached helm binary lives: ``<cache>/helm/v3.22.0/helm`` (it may not exist yet)."""
    return cache_root() / "helm" / f"v{HELM_VERSION}" / "helm"


def _reports_version(binary: Path) -> bool:
    try:
        result = subprocess.run(
            [str(binary), "version", "--short"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return False
    return result.returncode == 0 and result.stdout.startswith(f"v{HELM_VERSION}")


def _runs(binary: Path) -> bool:
    # The manifest is written last: a binary without it comes from an older recipe (no Kubernetes version stamp).
    return (binary.parent / "manifest.json").is_file() and _reports_version(binary)


def build_helm(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) helm and return its path.

    Raises:
        BuildError: no or too old Go toolchain, or a failed ``go`` step (with the output tail).
    """
    final = helm_path()
    if not force and _runs(final):
        progress(f"helm v{HELM_VERSION} is cached in {final.parent}")
        return final
    final.parent.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(final.parent.parent / ".build.lock", progress):
        if not force and _runs(final):
            return final
        progress(f"building helm v{HELM_VERSION} from its Go module into {final.parent}")
        go = _check_go(progress)
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "auto"))
        runner = _Runner(env=env, progress=progress, retry_hint="re-running `make bootstrap` builds it again.")
        work = final.parent.parent / "work"
        _fresh_module(go, runner, work, "local/helmbin")
        runner.run([go, "get", f"{_PACKAGE}@v{HELM_VERSION}"], work, "helm: go get")
        # helm's Makefile stamps its version and the Kubernetes version of its client-go (the default
        # `.Capabilities.KubeVersion` of `helm template`; v1.20 otherwise).
        client_go = runner.run([go, "list", "-m", "-f", "{{.Version}}", "k8s.io/client-go"], work, "helm: client-go")
        minor = client_go.strip().split(".")[1]
        stamp = "helm.sh/helm/v3/internal/version"
        ldflags = f"-s -w -X {stamp}.version=v{HELM_VERSION} -X {stamp}.gitTreeState=clean"
        for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
            ldflags += f" -X {pkg}.k8sVersionMajor=1 -X {pkg}.k8sVersionMinor={minor}"
        partial = final.parent.parent / f".partial-helm-{HELM_VERSION}"
        runner.run(
            [go, "build", "-v", "-p", "2", "-trimpath", "-ldflags", ldflags, "-o", str(partial), _PACKAGE],
            work,
            "helm: go build",
            count_lines=True,
        )
        if not _reports_version(partial):
            raise BuildError(f"the helm built in {partial} does not report v{HELM_VERSION}")
        final.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(final)
        (final.parent / "manifest.json").write_text(json.dumps({"helm": HELM_VERSION, "kubernetes_minor": minor}))
        shutil.rmtree(work, ignore_errors=True)
        progress(f"helm v{HELM_VERSION} ready in {final}")
        return final


if __name__ == "__main__":
    try:
        build_helm(force="--force" in sys.argv[1:])
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
