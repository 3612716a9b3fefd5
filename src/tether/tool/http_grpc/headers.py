"""HTTP header rules of HTTP over gRPC, on both sides (kas.md §5.3 step 3, §5.4).

Headers travel in ``map<string, prototool.Values>`` keyed by the canonical header name (Go's
``CanonicalMIMEHeaderKey`` form, e.g. ``Content-Type``), so an upstream agentk or kas reads them as it
reads its own. Hop-by-hop headers never cross a hop; an upgrade keeps its ``Upgrade`` value and gets a
fresh ``Connection: upgrade``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tether import __version__
from tether.pb.gitlab.agent.prototool import prototool_pb2

__all__ = [
    "HOP_BY_HOP",
    "HeaderMap",
    "canonical_key",
    "clean_headers",
    "from_values",
    "is_upgrade",
    "to_values",
    "via_value",
]

#: A header map: canonical name -> values in the order received.
HeaderMap = dict[str, list[str]]

#: Headers that belong to one connection (RFC 9110 §7.6.1 plus the ones kas.md §5.3 lists), lower-case.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def canonical_key(name: str) -> str:
    """Return ``name`` in canonical form: first letter and each letter after ``-`` upper case, others lower.

    ``content-type`` -> ``Content-Type``; ``x-csrf-token`` -> ``X-Csrf-Token``.
    """
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def _connection_tokens(pairs: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for key, value in pairs:
        if key.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def is_upgrade(pairs: Iterable[tuple[str, str]]) -> bool:
    """Whether the headers ask for (or, in a response, accept) an HTTP upgrade.

    True when ``Connection`` lists ``upgrade`` and an ``Upgrade`` header is present (RFC 9110 §7.8).
    """
    listed = list(pairs)
    return "upgrade" in _connection_tokens(listed) and any(k.lower() == "upgrade" and v for k, v in listed)


def clean_headers(pairs: Iterable[tuple[str, str]], drop: Iterable[str] = ()) -> HeaderMap:
    """Copy headers for the next hop (kas.md §5.3 step 3).

    Args:
        pairs: (name, value) pairs as received; names in any case.
        drop: further header names to remove (any case), e.g. ``Authorization``.

    Returns:
        Canonical name -> values, without ``Host``, hop-by-hop headers, headers named in ``Connection`` and
        ``drop``. For an upgrade, ``Upgrade`` is kept and ``Connection: upgrade`` set.
    """
    listed = list(pairs)
    upgrade = is_upgrade(listed)
    removed = HOP_BY_HOP | _connection_tokens(listed) | {"host"} | {d.lower() for d in drop}
    result: HeaderMap = {}
    for key, value in listed:
        if key.lower() not in removed:
            result.setdefault(canonical_key(key), []).append(value)
    if upgrade:
        result["Upgrade"] = [v for k, v in listed if k.lower() == "upgrade"]
        result["Connection"] = ["upgrade"]
    return result


def to_values(headers: Mapping[str, list[str]]) -> dict[str, prototool_pb2.Values]:
    """Header map -> ``map<string, prototool.Values>``."""
    return {key: prototool_pb2.Values(value=values) for key, values in headers.items()}


def from_values(values: Mapping[str, prototool_pb2.Values]) -> list[tuple[str, str]]:
    """``map<string, prototool.Values>`` -> (name, value) pairs, one per value."""
    return [(key, value) for key, entry in values.items() for value in entry.value]


def via_value(protocol: str, product: str) -> str:
    """A ``Via`` entry (RFC 9110 §7.6.3), e.g. ``via_value("gRPC/1.0", "gitlab-kas")``.

    Args:
        protocol: received protocol, ``gRPC/1.0`` or ``1.1``.
        product: ``gitlab-kas`` or ``gitlab-agent``; the version is appended as ``/<version>/tether``.
    """
    return f"{protocol} {product}/{__version__}/tether"
