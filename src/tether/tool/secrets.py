"""Secret files: base64 text, as upstream kas reads them (kas.md §4.2 "Secret files contain base64")."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path


class SecretError(ValueError):
    """A secret file is missing, unreadable or malformed; the message names the file."""


def load_base64_secret(path: Path, exact_length: int | None = None, min_length: int = 16) -> bytes:
    """Read ``path`` and return the base64-decoded bytes.

    Args:
        path: the file; surrounding whitespace is ignored.
        exact_length: required decoded length in bytes (the GitLab secret must be 32, kas.md §4.2).
        min_length: smallest accepted decoded length in bytes when ``exact_length`` is None.

    Raises:
        SecretError: unreadable file, invalid base64, or wrong length.
    """
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}") from exc
    try:
        secret = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SecretError(f"secret file {path} is not valid base64: {exc}") from exc
    if exact_length is not None and len(secret) != exact_length:
        raise SecretError(f"secret in {path} decodes to {len(secret)} bytes, expected {exact_length}")
    if len(secret) < min_length:
        raise SecretError(f"secret in {path} decodes to {len(secret)} bytes, expected at least {min_length}")
    return secret


def write_base64_secret(path: Path, secret: bytes) -> None:
    """Write ``secret`` base64-encoded to ``path`` with mode 0600 (used by `tether up` and tests)."""
    path.write_text(base64.b64encode(secret).decode() + "\n")
    path.chmod(0o600)
