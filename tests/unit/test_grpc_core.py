"""gRPC Core's I/O engine is chosen before grpcio loads, and an operator's choice wins (tool/grpc_core.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tether.tool.grpc_core import LEGACY_IO_EXPERIMENTS, select_io_engine

#: Runs the console script's entry point, then says what Core would read and whether grpcio was loaded yet.
ENTRY = (
    "import os, sys\n"
    "import tether.cli\n"
    "sys.argv = ['tether', '--version']\n"
    "try:\n"
    "    tether.cli.main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(repr(os.environ.get('GRPC_EXPERIMENTS')), 'grpc' in sys.modules)\n"
)


def test_the_legacy_engine_is_the_default() -> None:
    environ: dict[str, str] = {}
    assert select_io_engine(environ) == LEGACY_IO_EXPERIMENTS
    assert environ == {"GRPC_EXPERIMENTS": LEGACY_IO_EXPERIMENTS}


@pytest.mark.parametrize("chosen", ["", "event_engine_client"])
def test_an_operators_choice_wins(chosen: str) -> None:
    environ = {"GRPC_EXPERIMENTS": chosen}
    assert select_io_engine(environ) == chosen
    assert environ == {"GRPC_EXPERIMENTS": chosen}


@pytest.mark.parametrize(("given", "expected"), [(None, LEGACY_IO_EXPERIMENTS), ("", "")])
def test_the_command_line_chooses_before_grpc_loads(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if given is not None:
        env["GRPC_EXPERIMENTS"] = given
    result = subprocess.run([sys.executable, "-c", ENTRY], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.split("\n")[-2] == f"{expected!r} False"
