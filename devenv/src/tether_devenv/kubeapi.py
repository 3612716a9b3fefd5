"""A minimal synchronous Kubernetes REST caller for bootstrapping the local cluster.

Only the test environment uses it (readiness, fake nodes, waiting for the default ServiceAccount);
product code talks to Kubernetes through the asyncio layer.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    """A non-2xx answer; ``status`` is the HTTP code and the message carries the response body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class KubeApi:
    """Bearer-token HTTPS access to one API server.

    Attributes:
        server: base URL, e.g. ``https://127.0.0.1:6443``.
        token: bearer token.
        ca_file: PEM file of the CA that signed the serving certificate.
    """

    server: str
    token: str
    ca_file: Path

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Send one request and return the decoded JSON (or text for non-JSON answers).

        Args:
            method: HTTP method.
            path: absolute path with query, e.g. ``/api/v1/nodes``.
            body: JSON-serialisable request body, or None.
            timeout: seconds for the whole request.

        Raises:
            ApiError: on a non-2xx status.
            OSError: on connection failures.
        """
        context = ssl.create_default_context(cafile=str(self.ca_file))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=context, timeout=timeout) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")[:500]) from exc
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    def ok(self, path: str) -> bool:
        """Return True when ``GET path`` answers 2xx (connection errors and non-2xx give False)."""
        try:
            self.request("GET", path, timeout=2.0)
        except (ApiError, OSError):
            return False
        return True
