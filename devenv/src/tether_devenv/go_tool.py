"""One upstream Go command built from its module once per machine, cached beside the Kubernetes binaries.

``go build <package>`` in a throw-away wrapper module (the recipe of ``build.py``) into
``<cache>/<name>/v<version>/<name>``. The binary is moved into place only once it works, and the manifest is
written last: a binary without one is the leftover of an interrupted build (or of an older recipe) and is built
again. Used for helm (``helm.py``) and Jaeger (``jaeger.py``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tether_devenv.assets import cache_root
from tether_devenv.build import BuildError, Progress, _check_go, _exclusive, _fresh_module, _Runner

__all__ = ["GoTool"]

#: ``(go, runner, work module) -> (ldflags, manifest entries)``: what the build stamps into the binary.
Stamp = Callable[[str, _Runner, Path], tuple[str, dict[str, str]]]


def _stripped(_go: str, _runner: _Runner, _work: Path) -> tuple[str, dict[str, str]]:
    return "-s -w", {}


@dataclass(frozen=True)
class GoTool:
    """A Go command to build and cache.

    Attributes:
        name: the binary's name, e.g. ``helm``.
        package: its main package, e.g. ``helm.sh/helm/v3/cmd/helm``.
        version: its module's version without the ``v`` (``../shared/reference/deployment.md`` §1).
        works: whether a built binary at the given path works (e.g. reports its version).
        stamp: the build's ldflags and manifest entries (default: stripped, nothing stamped).
    """

    name: str
    package: str
    version: str
    works: Callable[[Path], bool]
    stamp: Stamp = field(default=_stripped)

    @property
    def path(self) -> Path:
        """Where the cached binary lives, ``<cache>/<name>/v<version>/<name>`` (it may not exist yet)."""
        return cache_root() / self.name / f"v{self.version}" / self.name

    def is_built(self) -> bool:
        """Whether the cached binary is complete (its manifest written) and works."""
        return (self.path.parent / "manifest.json").is_file() and self.works(self.path)

    def build(self, force: bool = False, progress: Progress = print) -> Path:
        """Build (or reuse) the binary and return its path.

        Raises:
            BuildError: no or too old Go toolchain, a failed ``go`` step (with the output tail), or a binary that
                does not work.
        """
        final = self.path
        if not force and self.is_built():
            progress(f"{self.name} v{self.version} is cached in {final.parent}")
            return final
        final.parent.parent.mkdir(parents=True, exist_ok=True)
        with _exclusive(final.parent.parent / ".build.lock", progress):
            if not force and self.is_built():
                return final
            progress(f"building {self.name} v{self.version} from its Go module into {final.parent}")
            go = _check_go(progress)
            env = dict(
                os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "auto")
            )
            runner = _Runner(env=env, progress=progress, retry_hint="re-running `make bootstrap` builds it again.")
            work = final.parent.parent / "work"
            _fresh_module(go, runner, work, f"local/{self.name}bin")
            runner.run([go, "get", f"{self.package}@v{self.version}"], work, f"{self.name}: go get")
            ldflags, manifest = self.stamp(go, runner, work)
            partial = final.parent.parent / f".partial-{self.name}-{self.version}"
            runner.run(
                [go, "build", "-v", "-p", "2", "-trimpath", "-ldflags", ldflags, "-o", str(partial), self.package],
                work,
                f"{self.name}: go build",
                count_lines=True,
            )
            if not self.works(partial):
                raise BuildError(f"the {self.name} built in {partial} does not work")
            final.parent.mkdir(parents=True, exist_ok=True)
            partial.rename(final)
            (final.parent / "manifest.json").write_text(json.dumps({self.name: self.version, **manifest}))
            shutil.rmtree(work, ignore_errors=True)
            progress(f"{self.name} v{self.version} ready in {final}")
            return final
