"""Secret tokens: generation and the digest the database keeps instead of the token.

Tokens carry 192+ bits of randomness, so an unsalted SHA-256 is a safe lookup key (GitLab stores token digests
the same way). Prefixes follow GitLab: ``glpat-`` for personal access tokens, ``glagent-`` for agent tokens.
"""

from __future__ import annotations

import hashlib
import secrets

PAT_PREFIX = "glpat-"
AGENT_TOKEN_PREFIX = "glagent-"
_PAT_RANDOM_BYTES = 24
_AGENT_RANDOM_BYTES = 36


def digest(token: str) -> str:
    """Lowercase hex SHA-256 of ``token`` (UTF-8), the only form a token is stored in."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_personal_access_token() -> str:
    """A new personal access token: ``glpat-`` and 32 URL-safe characters (192 random bits)."""
    return PAT_PREFIX + secrets.token_urlsafe(_PAT_RANDOM_BYTES)


def new_agent_token() -> str:
    """A new agent token: ``glagent-`` and 48 URL-safe characters (288 random bits)."""
    return AGENT_TOKEN_PREFIX + secrets.token_urlsafe(_AGENT_RANDOM_BYTES)
