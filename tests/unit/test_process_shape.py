"""The processes stay thin (issue 24 item 3): no function in ``kas/`` or ``agentk/`` longer than 60 lines.

Read from the source with ``ast``: a function's length counts from its ``def`` line to its last line,
docstring and comments included. Longer wiring belongs in a listener, service or module file of its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether

MAX_LINES = 60
PACKAGES = ("kas", "agentk")
SOURCE = Path(tether.__file__).parent


def _functions(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            yield f"{path.relative_to(SOURCE.parent)}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_longer_than_60_lines(package: str) -> None:
    files = sorted((SOURCE / package).rglob("*.py"))
    assert files, f"no sources under {SOURCE / package}"
    too_long = {name: lines for path in files for name, lines in _functions(path) if lines > MAX_LINES}
    assert not too_long, f"functions over {MAX_LINES} lines (split them): {too_long}"
