"""The runtime package on its own: a wheel installed without extras runs `tether kas` and `tether agentk`.

The hub and the CLI clients come with extras, the dev environment (cluster build, PKI, `tether up`) is its own
package (devenv/), so a kas or agentk image carries neither `cryptography` nor `rich` nor the hub's web and
database stack nor the dev environment.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.runtime_venv import RuntimeVenvError, build_runtime_venv, uv_command


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    # Without PYTHONPATH: the venv's installed wheel answers, not a source tree on the caller's path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=600, env=env)


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        uv_command()
    except RuntimeVenvError as exc:
        pytest.skip(str(exc))
    return build_runtime_venv(tmp_path_factory.mktemp("runtime"))


def test_runtime_install_leaves_out_the_dev_and_hub_dependencies(runtime_venv: Path) -> None:
    probe = (
        "import importlib.util as u; "
        "names = ('rich', 'cryptography', 'fastapi', 'sqlalchemy', 'pytest', 'tether_devenv'); "
        "print(sorted(m for m in names if u.find_spec(m)))"
    )
    result = _run([str(runtime_venv / "bin" / "python"), "-c", probe])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("command", "expected"), [("kas", "--configuration-file"), ("agentk", "--kas-address")])
def test_kas_and_agentk_help_work_without_extras(runtime_venv: Path, command: str, expected: str) -> None:
    result = _run([str(runtime_venv / "bin" / "tether"), command, "--help"])
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout
    assert "Traceback" not in result.stderr


def test_dev_commands_name_the_package_they_need(runtime_venv: Path) -> None:
    result = _run([str(runtime_venv / "bin" / "tether"), "up", "--help"])
    assert result.returncode == 1
    assert "pip install -e ./devenv" in result.stderr
    assert "Traceback" not in result.stderr


def test_top_level_help_lists_every_command(runtime_venv: Path) -> None:
    result = _run([str(runtime_venv / "bin" / "tether"), "--help"])
    assert result.returncode == 0, result.stderr
    for command in ("kas", "agentk", "hub", "graph", "up", "dev"):
        assert f"  {command} " in result.stdout
    assert "not installed: pip install -e ./devenv" in result.stdout
