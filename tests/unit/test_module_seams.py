"""The seams a module works through (issue 24): its own folder, the module APIs, and the agent connection.

A kas module reaches agents only through ``ServerApi.agent_conn`` (upstream ``AgentConn``): no module imports
the tunnel machinery (``tether.tunnel``), none gets the router, the tunnel registry or the state store from
``ServerApi``, and no module imports another module's internals (a module's own package, upstream's
``api.go``, holds the names other modules may share; the generated ``pb`` code is everybody's).
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from tether.modserver.api import ServerApi

SRC = Path(__file__).resolve().parents[2] / "src"
MODULES = SRC / "tether" / "modules"


def _imports(path: Path) -> list[str]:
    """Every module name ``path`` imports, at any depth (lazy imports in functions count too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _module_imports() -> list[tuple[str, str, str]]:
    """(module name, file, imported name) for every import in ``src/tether/modules/<name>/``."""
    found = []
    for path in sorted(MODULES.rglob("*.py")):
        relative = path.relative_to(MODULES)
        if len(relative.parts) < 2:
            continue  # modules/__init__.py
        found.extend((relative.parts[0], str(relative), name) for name in _imports(path))
    return found


def test_the_scan_sees_the_modules() -> None:
    owners = {owner for owner, _, _ in _module_imports()}
    assert {"kubernetes_api", "workspace_access", "graph", "pods", "gitlab_access", "reverse_tunnel"} <= owners


def test_no_module_imports_the_tunnel_machinery() -> None:
    wrong = [
        f"{file} imports {name}" for _, file, name in _module_imports() if name.split(".")[:2] == ["tether", "tunnel"]
    ]
    assert wrong == []


def test_no_module_imports_another_modules_internals() -> None:
    wrong = []
    for owner, file, name in _module_imports():
        parts = name.split(".")
        if parts[:2] != ["tether", "modules"] or len(parts) < 3 or parts[2] == owner:
            continue
        if len(parts) > 3:  # tether.modules.<other> itself is its public surface
            wrong.append(f"{file} imports {name}")
    assert wrong == []


def test_server_api_hands_out_no_routing_internals() -> None:
    fields = {f.name for f in dataclasses.fields(ServerApi)}
    assert not fields & {"router", "tunnels", "backend"}
    hints = typing.get_type_hints(ServerApi)
    from_tunnel = {
        name: hint
        for name, hint in hints.items()
        for part in typing.get_args(hint) or (hint,)
        if getattr(part, "__module__", "").startswith("tether.tunnel")
    }
    assert from_tunnel == {}
    assert "agent_conn" in fields
