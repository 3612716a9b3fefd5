"""Build helm from its Go module once per machine, cached beside the Kubernetes binaries (issue 22 item 3).

``go build helm.sh/helm/v3/cmd/helm`` (``go_tool.py``), with the version stamped the way helm's own Makefile
does (``internal/version``), into ``<cache>/helm/v<version>/helm``. ``tests/deploy/test_charts.py`` lints and
renders the charts with it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tether_devenv.build import BuildError, Progress, _Runner
from tether_devenv.go_tool import GoTool

__all__ = ["HELM_VERSION", "build_helm", "helm_path"]

#: ``helm.sh/helm/v3`` release (``../shared/reference/deployment.md`` §1).
HELM_VERSION = "3.22.0"


def _reports_version(binary: Path) -> bool:
    try:
        result = subprocess.run(
            [str(binary), "version", "--short"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return False
    return result.returncode == 0 and result.stdout.startswith(f"v{HELM_VERSION}")


def _stamp(go: str, runner: _Runner, work: Path) -> tuple[str, dict[str, str]]:
    # helm's Makefile stamps its version and the Kubernetes version of its client-go (the default
    # `.Capabilities.KubeVersion` of `helm template`; v1.20 otherwise). A cached helm without the stamp in its
    # manifest comes from an older recipe and is built again.
    client_go = runner.run([go, "list", "-m", "-f", "{{.Version}}", "k8s.io/client-go"], work, "helm: client-go")
    minor = client_go.strip().split(".")[1]
    stamp = "helm.sh/helm/v3/internal/version"
    ldflags = f"-s -w -X {stamp}.version=v{HELM_VERSION} -X {stamp}.gitTreeState=clean"
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        ldflags += f" -X {pkg}.k8sVersionMajor=1 -X {pkg}.k8sVersionMinor={minor}"
    return ldflags, {"kubernetes_minor": minor}


_HELM = GoTool("helm", "helm.sh/helm/v3/cmd/helm", HELM_VERSION, _reports_version, _stamp)


def helm_path() -> Path:
    """Where the cached helm binary lives: ``<cache>/helm/v3.22.0/helm`` (it may not exist yet)."""
    return _HELM.path


def build_helm(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) helm and return its path.

    Raises:
        BuildError: no or too old Go toolchain, or a failed ``go`` step (with the output tail).
    """
    return _HELM.build(force, progress)


if __name__ == "__main__":
    try:
        build_helm(force="--force" in sys.argv[1:])
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
