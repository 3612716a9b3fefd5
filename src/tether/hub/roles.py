"""GitLab's membership roles and their access levels (GitLab ``Gitlab::Access``; docs "Roles and permissions")."""

from __future__ import annotations

from enum import IntEnum

from tether.tool.ids import is_ascii_number


class Role(IntEnum):
    """A membership role; the value is GitLab's ``access_level``."""

    NO_ACCESS = 0
    GUEST = 10
    REPORTER = 20
    DEVELOPER = 30
    MAINTAINER = 40
    OWNER = 50

    @property
    def label(self) -> str:
        """Lowercase role name as kas expects it in ``access_as.user`` roles (``developer``, ...)."""
        return self.name.lower()


#: Levels a membership may have (``NO_ACCESS`` is not a membership).
MEMBER_LEVELS = frozenset(role.value for role in Role if role is not Role.NO_ACCESS)


def parse_role(text: str) -> Role:
    """Return the role named ``text`` (``developer``) or numbered ``text`` (``30``).

    Raises:
        ValueError: unknown role name or level.
    """
    value = text.strip().lower()
    if is_ascii_number(value) and len(value) < 4 and int(value) in MEMBER_LEVELS:
        return Role(int(value))
    for role in Role:
        if role.label == value and role is not Role.NO_ACCESS:
            return role
    raise ValueError(f"unknown role {text!r}: use guest, reporter, developer, maintainer, owner or 10..50")
