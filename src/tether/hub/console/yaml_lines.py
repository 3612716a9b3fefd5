"""Find the line of an agent configuration that a validation error is about, to show the error beside it."""

from __future__ import annotations

import re

import yaml

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _norm(key: str) -> str:
    # The configuration is read with protobuf JSON rules: ``access_as`` and ``accessAs`` are the same field.
    return key.replace("_", "").lower()


def error_line(content: str, field: str) -> int | None:
    """The 1-based line of ``content`` (YAML) that ``field`` names, or None when no line fits.

    Args:
        content: the YAML text the user sent.
        field: the error's field path, e.g. ``configuration.observability.logging.levle`` or
            ``configuration.user_access.projects[0].id``; the leading ``configuration`` is the document itself.

    A YAML syntax error gives the line the parser stopped at. A path gives the line of its deepest key that
    exists in the document (a missing ``access_as`` points at ``user_access``).
    """
    try:
        node = yaml.compose(content)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        return mark.line + 1 if mark is not None else None
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    parts = [m.group(1) if m.group(1) is not None else int(m.group(2)) for m in _PART.finditer(field)]
    if parts and parts[0] == "configuration":
        parts = parts[1:]
    line: int | None = None
    for part in parts:
        if isinstance(part, int) and isinstance(node, yaml.SequenceNode) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
            continue
        if isinstance(part, str) and isinstance(node, yaml.MappingNode):
            found = next(
                ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and _norm(k.value) == _norm(part)),
                None,
            )
            if found is not None:
                line = found[0].start_mark.line + 1
                node = found[1]
                continue
        break
    return line
