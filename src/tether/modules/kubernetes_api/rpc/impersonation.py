"""Impersonation headers for the identity kas imposes (kas.md §4.5, §5.4).

kas puts a ``kubernetes_api.rpc.ImpersonationConfig`` into the request (``auth.impersonation_for``); agentk
turns it into the ``Impersonate-*`` headers client-go would send. A request that already carries ``Impersonate-*``
headers while an identity is imposed is "nested impersonation" and is refused on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.kube.impersonation import impersonation_headers

__all__ = [
    "IMPERSONATE_PREFIX",
    "NESTED_IMPERSONATION",
    "carries_impersonation",
    "impersonation_headers",
]

IMPERSONATE_PREFIX = "impersonate-"
NESTED_IMPERSONATION = "nested impersonation is not supported"


def carries_impersonation(header_names: Iterable[str]) -> str | None:
    """The first ``Impersonate-*`` header name among ``header_names`` (any case), or None."""
    for name in header_names:
        if name.lower().startswith(IMPERSONATE_PREFIX):
            return name
    return None
