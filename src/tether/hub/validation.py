"""Name and path rules for users, groups, projects and agents.

Sources: GitLab's path rules (``Gitlab::PathRegex``: letters, digits, ``_``, ``-``, ``.``; no leading ``-`` or
``.``; no trailing ``.``, ``.git`` or ``.atom``) and the agent name rule of upstream ``doc/identity_and_auth.md``
(a DNS label of at most 63 characters, kas.md §4.1).
"""

from __future__ import annotations

import re

from tether.hub.errors import BadRequest

AGENT_NAME_MAX = 63
PATH_MAX = 255
NAME_MAX = 255
_AGENT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PATH = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9_.-]*")
_FULL_PATH = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9_.-]*(/[a-zA-Z0-9_][a-zA-Z0-9_.-]*)*")


def check_agent_name(name: str) -> str:
    """Return ``name`` if it is a valid agent name.

    Raises:
        BadRequest: on field ``name``: empty, longer than 63 characters, or not a DNS label.
    """
    if not name:
        raise BadRequest.field("name", "can't be blank")
    if len(name) > AGENT_NAME_MAX:
        raise BadRequest.field("name", f"is too long (maximum is {AGENT_NAME_MAX} characters)")
    if not _AGENT_NAME.fullmatch(name):
        raise BadRequest.field(
            "name", "can contain only lowercase letters, digits, and '-', but cannot start or end with '-'"
        )
    return name


def check_path(path: str, field: str = "path") -> str:
    """Return ``path`` if it is a valid username, group path or project path (one segment).

    Raises:
        BadRequest: on ``field``: empty, too long, bad characters, or a forbidden ending.
    """
    if not path:
        raise BadRequest.field(field, "can't be blank")
    if len(path) > PATH_MAX:
        raise BadRequest.field(field, f"is too long (maximum is {PATH_MAX} characters)")
    if not _PATH.fullmatch(path) or path.endswith((".", ".git", ".atom")):
        raise BadRequest.field(
            field,
            "can contain only letters, digits, '_', '-' and '.'. Cannot start with '-' or '.', "
            "or end in '.', '.git' or '.atom'.",
        )
    return path


def check_name(name: str, field: str = "name") -> str:
    """Return ``name`` (a display name) stripped, if non-empty and at most 255 characters.

    Raises:
        BadRequest: on ``field``.
    """
    name = name.strip()
    if not name:
        raise BadRequest.field(field, "can't be blank")
    if len(name) > NAME_MAX:
        raise BadRequest.field(field, f"is too long (maximum is {NAME_MAX} characters)")
    return name


def is_full_path(text: str) -> bool:
    """True when ``text`` looks like ``group/sub/project`` (segments as :func:`check_path`)."""
    return bool(_FULL_PATH.fullmatch(text)) and len(text) <= 2048
