"""``Impersonate-*`` headers for an identity, as client-go sends them (kas.md §4.5, §5.4).

Used by agentk wherever it acts as the identity kas imposes: the Kubernetes API proxy's ``MakeRequest`` and the
Graph API's discovery, lists and watches (``KubeClient.with_headers``).
"""

from __future__ import annotations

import string

from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2

__all__ = ["impersonation_headers"]

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
