"""Who is acting: a user authenticated by a personal access token, or the operator at the CLI."""

from __future__ import annotations

from dataclasses import dataclass

SCOPE_API = "api"
SCOPE_READ_API = "read_api"
SCOPE_K8S_PROXY = "k8s_proxy"
#: Scopes a personal access token may have (GitLab names).
SCOPES = frozenset({SCOPE_API, SCOPE_READ_API, SCOPE_K8S_PROXY})


@dataclass(frozen=True)
class Principal:
    """The caller of an operation.

    Attributes:
        user_id: the user, or None for the operator at the CLI (who acts as an administrator).
        username: the user's name, ``(cli)`` for the operator.
        admin: instance administrator: every permission.
        scopes: the token's scopes (the operator has all).
        token_id: the personal access token used, if any.
    """

    user_id: int | None
    username: str
    admin: bool
    scopes: frozenset[str]
    token_id: int | None = None

    @classmethod
    def operator(cls) -> Principal:
        """The CLI operator: an administrator with every scope and no user record."""
        return cls(user_id=None, username="(cli)", admin=True, scopes=SCOPES)

    @property
    def can_write(self) -> bool:
        """True with the ``api`` scope (GitLab: ``read_api`` is read-only; ``k8s_proxy`` has no REST access)."""
        return SCOPE_API in self.scopes

    @property
    def can_read(self) -> bool:
        """True with ``api`` or ``read_api``."""
        return bool(self.scopes & {SCOPE_API, SCOPE_READ_API})
