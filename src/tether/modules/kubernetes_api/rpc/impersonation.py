"""Impersonation headers for the identity kas imposes (kas.md §4.5, §5.4).

kas puts a ``kubernetes_api.rpc.ImpersonationConfig`` into the request (``auth.impersonation_for``); agentk
turns it into the ``Impersonate-*`` headers client-go would send. A request that already carries ``Impersonate-*``
headers while an identity is imposed is "nested impersonation" and is refused on both sides.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2

__all__ = [
    "IMPERSONATE_PREFIX",
    "NESTED_IMPERSONATION",
    "carries_impersonation",
    "impersonation_headers",
]

IMPERSONATE_PREFIX = "impersonate-"
NESTED_IMPERSONATION = "nested impersonation is not supported"
#: Bytes allowed unescaped in a header name (RFC 9110 token characters) except ``%``, which is escaped too
#: so the API server's percent-decoding of ``Impersonate-Extra-<key>`` is unambiguous.
_HEADER_KEY_SAFE = frozenset((string.ascii_letters + string.digits + "!#$&'*+-.^_`|~").encode())


def _escape_header_key(key: str) -> str:
    return "".join(chr(b) if b in _HEADER_KEY_SAFE else f"%{b:02X}" for b in key.encode())


def impersonation_headers(config: rpc_pb2.ImpersonationConfig) -> list[tuple[str, str]]:
    """``Impersonate-User``, ``-Uid``, ``-Group`` (one per group) and ``-Extra-<key>`` (one per value).

    Extra keys are percent-encoded where a header name cannot hold them (``/`` -> ``%2F``), as client-go
    does; the API server decodes them.
    """
    headers = [("Impersonate-User", config.username)]
    if config.uid:
        headers.append(("Impersonate-Uid", config.uid))
    headers += [("Impersonate-Group", group) for group in config.groups]
    for extra in config.extra:
        name = "Impersonate-Extra-" + _escape_header_key(extra.key)
        headers += [(name, value) for value in extra.val]
    return headers


def carries_impersonation(header_names: Iterable[str]) -> str | None:
    """The first ``Impersonate-*`` header name among ``header_names`` (any case), or None."""
    for name in header_names:
        if name.lower().startswith(IMPERSONATE_PREFIX):
            return name
    return None
