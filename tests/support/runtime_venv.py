"""Install the runtime package (no extras) into a fresh virtual environment, as a kas or agentk image would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class RuntimeVenvError(RuntimeError):
    """uv is missing, or building or installing the wheel failed (the message has uv's output)."""


def uv_command() -> list[str]:
    """How to run uv here: the ``uv`` script, else ``python3 -m uv`` (what scripts/bootstrap.sh installs).

    Raises:
        RuntimeVenvError: uv is not installed.
    """
    if shutil.which("uv"):
        return ["uv"]
    for python in ("python3", sys.executable):
        found = shutil.which(python) or python
        if subprocess.run([found, "-m", "uv", "--version"], capture_output=True, check=False).returncode == 0:
            return [found, "-m", "uv"]
    raise RuntimeVenvError("uv is not installed (scripts/bootstrap.sh installs it)")


def build_runtime_venv(work: Path) -> Path:
    """Build the wheel of this checkout and install it without extras into ``work/venv``; return the venv.

    Versions are constrained to uv.lock, so the figures measured with it match the development environment's.

    Raises:
        RuntimeVenvError: see the class.
    """
    uv = uv_command()
    venv = work / "venv"
    steps = [
        [*uv, "build", "--wheel", "--out-dir", str(work / "dist"), str(REPO)],
        [*uv, "venv", "--python", "python3.11", str(venv)],
    ]
    for step in steps:
        _run(step)
    constraints = work / "constraints.txt"
    _run(
        [
            *uv,
            "export",
            "--frozen",
            "--no-dev",
            "--no-emit-project",
            "--no-hashes",
            "--project",
            str(REPO),
            "--output-file",
            str(constraints),
        ]
    )
    wheel = next((work / "dist").glob("tether-*.whl"))
    _run(
        [*uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--constraints", str(constraints), str(wheel)]
    )
    return venv


def _run(args: list[str]) -> None:
    result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise RuntimeVenvError(f"{' '.join(args)} failed:\n{result.stderr[-2000:]}")
