"""The internal API secret: loaded from its file, or generated once for the embedded default."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tether.hub.config import HubConfig
from tether.tool.secrets import SecretError, load_base64_secret, write_base64_secret

#: kas requires the GitLab secret to decode to exactly 32 bytes (kas.md §4.2).
SECRET_LENGTH = 32


def gitlab_secret(config: HubConfig) -> bytes:
    """The internal API JWT secret.

    When ``gitlab.authentication_secret_file`` is not set and ``<data_dir>/gitlab_secret`` does not exist, a
    random secret is written there (mode 0600) so kas can be pointed at the same file.

    Raises:
        tether.tool.secrets.SecretError: unreadable file, bad base64, or not 32 bytes.
    """
    path = config.gitlab_secret_file
    if config.gitlab.authentication_secret_file is None and not path.exists():
        _create(path)
    return load_base64_secret(path, exact_length=SECRET_LENGTH)


def gitaly_token(config: HubConfig) -> str:
    """The token kas signs its calls to the hub's Gitaly-compatible service with (text, no whitespace).

    When ``gitaly.token_file`` is not set and ``<data_dir>/gitaly_token`` does not exist, a random token is
    written there (mode 0600).

    Raises:
        tether.tool.secrets.SecretError: unreadable or empty file.
    """
    path = config.gitaly_token_file
    if config.gitaly.token_file is None and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32) + "\n")
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise SecretError(f"cannot read the Gitaly token file {path}: {exc.strerror}") from exc
    if not token:
        raise SecretError(f"the Gitaly token file {path} is empty")
    return token


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_base64_secret(path, os.urandom(SECRET_LENGTH))
