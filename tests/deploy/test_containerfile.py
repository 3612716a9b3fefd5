"""The Containerfile (Docker/Podman) states what ``make images`` builds: same recipe, user, environment, entrypoints.

Its build stage runs ``python -m tether_devenv.images --rootfs-dir``, so the package allow-list, the wheels and
the extra files cannot drift; this test checks the rest, which a container engine takes from the Containerfile.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tether import __version__
from tether_devenv.images import IMAGES, UID

CONTAINERFILE = Path(__file__).resolve().parents[2] / "Containerfile"


def _stages() -> dict[str, list[tuple[str, str]]]:
    """``stage name -> [(INSTRUCTION, arguments)]``, continuation lines joined, comments dropped."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, arguments = line.strip().partition(" ")
        if instruction == "FROM":
            current = []
            stages[arguments.split(" AS ")[1].strip()] = current
        current.append((instruction, " ".join(arguments.split())))
    return stages


def test_the_build_stage_runs_the_scripted_build_for_every_image() -> None:
    build = _stages()["build"]
    runs = [args for instruction, args in build if instruction == "RUN"]
    assert f"PYTHONPATH=src:devenv/src python3 -m tether_devenv.images --rootfs-dir /rootfs {' '.join(IMAGES)}" in runs
    apt = next(r for r in runs if "apt-get install" in r)
    assert {"mmdebstrap", "binutils", "python3"} <= set(shlex.split(apt))


@pytest.mark.parametrize("name", list(IMAGES))
def test_each_final_stage_matches_the_scripted_image(name: str) -> None:
    stage = dict(_stages()[name])
    assert stage["FROM"] == f"scratch AS {name}"
    assert stage["COPY"] == f"--from=build /rootfs/{name}/ /"
    assert stage["USER"] == f"{UID}:{UID}"
    assert json.loads(stage["ENTRYPOINT"]) == list(IMAGES[name].entrypoint)
    assert dict(pair.split("=", 1) for pair in shlex.split(stage["ENV"])) == IMAGES[name].env
    labels = dict(pair.split("=", 1) for pair in shlex.split(stage["LABEL"]))
    assert labels["org.opencontainers.image.title"] == f"tether-{name}"
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.description"] == IMAGES[name].description
