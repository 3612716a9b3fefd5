"""A process loads only what it runs: kas and agentk start without the graph engine, CEL, the hub or the dev env."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Loaded only by the first graph request, by other commands, or when configured.
NOT_AT_START = (
    "cel_expr_python",
    "tether.modules.graph.engine.engine",
    "tether.modules.graph.engine.request",
    "tether.modules.graph.rpc.wire",
    "tether.modules.graph.client.client",
    "tether.hub.server",
    "fastapi",
    "sqlalchemy",
    "tether_devenv",
    "redis",
)


@pytest.mark.parametrize(
    "modules",
    [
        ("tether.cli", "tether.agentk.command", "tether.agentk.app", "tether.agentk.modules"),
        ("tether.cli", "tether.kas.command", "tether.kas.app", "tether.kas.modules"),
    ],
)
def test_processes_import_only_what_they_run(modules: tuple[str, ...]) -> None:
    probe = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        f"print(json.dumps([m for m in {list(NOT_AT_START)!r} if m in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == []
