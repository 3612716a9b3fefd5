"""The error kas reports, as one clear line, when it cannot start."""

from __future__ import annotations


class KasStartError(RuntimeError):
    """kas cannot start (bad secret, port in use, wildcard private address without OWN_PRIVATE_API_URL...)."""
