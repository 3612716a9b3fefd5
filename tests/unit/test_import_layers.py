"""The import graph of src/tether, read from the source with ``ast``: layers, no cycles, no dev environment.

Layers, highest first: the ``cli`` entry point; the dev environment (with ``tether up``); processes
(``kas``, ``agentk``, ``hub``) -> ``modules`` -> the shared layer (``modserver``, ``modagent``,
``modshared``, ``tunnel``, ``kube``) -> ``tool`` and the generated ``pb``. A package imports only from its
own layer or below; the graph between packages has no cycle.

Inside the hub, layers again (``HUB_LAYERS``): entry points (``command``, ``cli``) -> the server -> the ASGI
``app`` that assembles the rest -> the browser ``console`` -> the REST/GraphQL/internal ``api`` -> the
``workspaces`` rules -> the ``service`` layer -> storage and the hub's small shared files (``db``, ``config``,
``errors``, ...). ``api``, ``console`` and ``workspaces`` import each other in that one direction only.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
#: The development environment, its own package (devenv/pyproject.toml) outside the runtime wheel.
DEVENV_SRC = ROOT / "devenv" / "src"

LAYERS: dict[str, int] = {
    "tether.cli": 5,
    "tether_devenv": 4,
    "tether.kas": 3,
    "tether.agentk": 3,
    "tether.hub": 3,
    "tether.modules": 2,
    "tether.modserver": 1,
    "tether.modagent": 1,
    "tether.modshared": 1,
    "tether.tunnel": 1,
    "tether.kube": 1,
    "tether.tool": 0,
    "tether.pb": 0,
    "tether": 0,
}
#: Everything a kas, agentk or hub image runs; none of it may reach the development environment.
RUNTIME = (
    "tether.kas",
    "tether.agentk",
    "tether.hub",
    "tether.modules",
    "tether.modserver",
    "tether.modagent",
    "tether.modshared",
    "tether.tunnel",
    "tether.kube",
    "tether.tool",
)
DEV = ("tether_devenv",)
#: The hub's own layers, highest first; a hub module not listed (``db``, ``config``, ``errors``...) is layer 0.
HUB_LAYERS: dict[str, int] = {
    "tether.hub.command": 8,
    "tether.hub.cli": 7,
    "tether.hub.server": 6,
    "tether.hub.app": 5,
    "tether.hub.console": 4,
    "tether.hub.api": 3,
    "tether.hub.workspaces": 2,
    "tether.hub.service": 1,
    "tether.hub": 0,
}


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p, base): p
        for base, package in ((SRC, "tether"), (DEVENV_SRC, "tether_devenv"))
        for p in base.joinpath(package).rglob("*.py")
        if "/pb/" not in p.as_posix()
    }


def _imports(path: Path, *, top_level_only: bool) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@functools.cache
def _graph(*, top_level_only: bool) -> dict[str, set[str]]:
    """Module -> tether modules it imports (names that are attributes, not modules, are dropped)."""
    known = _modules()
    return {
        name: {i for i in _imports(path, top_level_only=top_level_only) if i in known and i != name}
        for name, path in known.items()
    }


def _owner(module: str, table: dict[str, int] | tuple[str, ...]) -> str:
    """The longest entry of ``table`` that is ``module`` or a package above it."""
    candidates = [key for key in table if module == key or module.startswith(key + ".")]
    return max(candidates, key=len) if candidates else ""


def _hub_package(module: str) -> str:
    """``tether.hub.<name>``: the hub's subpackage or top-level file holding ``module``."""
    return ".".join(module.split(".")[:3])


def _package(module: str) -> str:
    """``tether.modules.<name>`` for modules, else the top-level package (``tether.kas``...)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["tether", "modules"] and len(parts) > 2 else ".".join(parts[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_scan_sees_the_processes_and_modules() -> None:
    graph = _graph(top_level_only=False)
    assert "tether.kas.modules" in graph["tether.kas.app"]
    assert "tether.modules.pods.server" in graph["tether.kas.modules"]
    assert "tether_devenv.cluster" in graph["tether_devenv.up"]


def test_the_runtime_package_holds_no_dev_environment() -> None:
    """Everything under src/tether goes into the runtime wheel (pyproject.toml); the dev environment is beside it."""
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["src/tether"]
    assert not SRC.joinpath("tether", "devenv").exists()
    assert not [p for p in SRC.joinpath("tether").rglob("*.py") if "devenv" in p.as_posix()]


def test_every_package_imports_only_its_own_layer_or_below() -> None:
    wrong = [
        f"{module} (layer {LAYERS[_owner(module, LAYERS)]}) imports {target} (layer {LAYERS[_owner(target, LAYERS)]})"
        for module, targets in _graph(top_level_only=False).items()
        for target in targets
        if LAYERS[_owner(target, LAYERS)] > LAYERS[_owner(module, LAYERS)]
    ]
    assert wrong == []


def test_modules_never_import_a_process() -> None:
    processes = ("tether.kas", "tether.agentk", "tether.hub", "tether.cli", "tether_devenv")
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph(top_level_only=False).items()
        if module.startswith("tether.modules")
        for target in targets
        if _owner(target, processes)
    ]
    assert wrong == []


#: A module's halves, each named by the process it runs in; none imports another (what they share sits beside
#: them, e.g. ``remote_development/protocol.py``).
HALVES = ("agent", "server", "hub")


def test_a_modules_halves_never_import_each_other() -> None:
    def half(module: str) -> tuple[str, str] | None:
        parts = module.split(".")
        return (
            (parts[2], parts[3])
            if parts[:2] == ["tether", "modules"] and len(parts) > 3 and parts[3] in HALVES
            else None
        )

    graph = _graph(top_level_only=False)
    assert {half(m) for m in graph} >= {("remote_development", "hub"), ("remote_development", "agent")}
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if (mine := half(module)) and (theirs := half(target)) and mine[0] == theirs[0] and mine[1] != theirs[1]
    ]
    assert wrong == []


def test_no_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in _graph(top_level_only=False).items():
        edges = packages.setdefault(_package(module), set())
        edges.update(_package(t) for t in targets if _package(t) != _package(module))
    assert _cycles(packages) == []


def test_the_hub_imports_only_its_own_layer_or_below() -> None:
    graph = _graph(top_level_only=False)
    assert "tether.hub.api.app" not in graph, "the app assembles api and console: it sits above both"
    wrong = [
        f"{module} (hub layer {HUB_LAYERS[_owner(module, HUB_LAYERS)]}) imports {target} "
        f"(hub layer {HUB_LAYERS[_owner(target, HUB_LAYERS)]})"
        for module, targets in graph.items()
        if _owner(module, ("tether.hub",))
        for target in targets
        if _owner(target, ("tether.hub",))
        and HUB_LAYERS[_owner(target, HUB_LAYERS)] > HUB_LAYERS[_owner(module, HUB_LAYERS)]
    ]
    assert wrong == []


def test_no_cycle_between_the_hubs_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in _graph(top_level_only=False).items():
        if not module.startswith("tether.hub."):
            continue
        edges = packages.setdefault(_hub_package(module), set())
        edges.update(
            _hub_package(t) for t in targets if t.startswith("tether.hub.") and _hub_package(t) != _hub_package(module)
        )
    assert _cycles(packages) == []


def test_no_import_cycle_between_files() -> None:
    assert _cycles(_graph(top_level_only=True)) == []


@pytest.mark.parametrize("root", RUNTIME)
def test_no_runtime_module_reaches_the_dev_environment(root: str) -> None:
    graph = _graph(top_level_only=False)
    for start in [m for m in graph if m == root or m.startswith(root + ".")]:
        seen, todo = {start}, [start]
        while todo:
            for target in graph[todo.pop()]:
                assert not _owner(target, DEV), f"{start} reaches {target}"
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
