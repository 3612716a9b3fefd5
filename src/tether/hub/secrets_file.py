"""The internal API secret: loaded from its file, or generated once for the embedded default."""

from __future__ import annotations

import os
from pathlib import Path

from tether.hub.config import HubConfig
from tether.tool.secrets import load_base64_secret, write_base64_secret

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


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_base64_secret(path, os.urandom(SECRET_LENGTH))
