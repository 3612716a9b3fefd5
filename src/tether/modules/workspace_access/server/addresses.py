"""Which workspace port a request names: ``<port>-<name>.<zone>`` hosts, or the ``/-/workspaces/<name>/<port>/`` path.

Only what kas serves is accepted, checked before anything else (credentials, the hub, the cluster): exactly one
``Host`` header made of a lower-case DNS name and an optional port; a host in one of ``dns_zones`` whose first
label is ``<port>-<name>`` (the rest of the host being the zone itself); or the host of ``path_url`` with a
path under ``/-/workspaces/``. A name is a DNS label (what the hub allows), a port 1-65535 without leading zeros.
Everything else is an :class:`AddressError` with a 4xx code and a message saying what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yarl

from tether.modules.workspace_access import CALLBACK_PATH, PATH_PREFIX

__all__ = ["AddressBook", "AddressError", "WorkspaceAddress"]

_HOST = re.compile(r"(?P<name>[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)(:(?P<port>[0-9]{1,5}))?")
_LABEL = re.compile(r"(?P<port>[1-9][0-9]{0,4})-(?P<name>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class AddressError(Exception):
    """The request names no workspace port that kas serves.

    Args:
        code: HTTP status: 400 (malformed ``Host`` or request target), 404 (a served host or path that names
            no workspace), 421 (a host kas does not serve), 308 (only the path form's missing trailing slash).
        message: what is wrong, for the client.
        location: for 308, where to go instead.
    """

    def __init__(self, code: int, message: str, location: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.location = location


@dataclass(frozen=True)
class WorkspaceAddress:
    """A request's workspace port, or the sign-in callback on a served origin.

    Attributes:
        name: the workspace name; empty for the callback.
        port: the Service port; 0 for the callback.
        zone: the DNS zone of a host-form address; None in the path form.
        origin: ``scheme://host[:port]`` as the user reached kas.
        scheme: ``http`` or ``https``.
        host: the ``Host`` header as received (lower case).
        prefix: the path form's ``/-/workspaces/<name>/<port>``; None in the host form.
        path: what the workspace sees: the raw (percent-encoded) path without the prefix, starting with ``/``.
        query: the raw query string without ``?``.
        callback: whether this is the sign-in callback (:data:`CALLBACK_PATH`).
    """

    name: str
    port: int
    zone: str | None
    origin: str
    scheme: str
    host: str
    prefix: str | None
    path: str
    query: str
    callback: bool = False

    @property
    def request_target(self) -> str:
        """Path (with the prefix) and query as the client asked for them, e.g. ``/-/workspaces/ws/60001/?a=1``."""
        path = (self.prefix or "") + self.path
        return f"{path}?{self.query}" if self.query else path

    @property
    def label(self) -> str:
        """``<port>-<name>`` for messages and logs."""
        return f"{self.port}-{self.name}"


def _split_target(raw: str) -> tuple[str, str]:
    if not raw.startswith("/") or raw.startswith("//"):
        raise AddressError(400, "the request target must be a path (origin form), e.g. GET /index.html")
    path, _, query = raw.partition("#")[0].partition("?")
    return path, query


class AddressBook:
    """The addresses one kas serves.

    Args:
        dns_zones: zones of the host form (lower case, validated by the configuration).
        host_scheme: scheme of the host form as users reach it (``http`` or ``https``).
        path_url: origin of the path form (``https://kas.example.com``), or None.
    """

    def __init__(self, dns_zones: list[str], host_scheme: str, path_url: str | None) -> None:
        # Longest first: a zone inside another zone is matched before its parent.
        self._zones = sorted(dns_zones, key=len, reverse=True)
        self._host_scheme = host_scheme
        self._path_origin: tuple[str, str, int] | None = None
        if path_url is not None:
            url = yarl.URL(path_url)
            assert url.scheme and url.host and url.port is not None  # checked by the configuration
            self._path_origin = (url.scheme, url.host.lower(), url.port)

    def parse(self, host_values: list[str], raw_target: str) -> WorkspaceAddress:
        """The workspace port a request names.

        Args:
            host_values: every ``Host`` header of the request.
            raw_target: the request target as received (``request.raw_path``: raw path and query).

        Raises:
            AddressError: see the class.
        """
        if len(host_values) != 1:
            raise AddressError(400, f"exactly one Host header is required, got {len(host_values)}")
        host = host_values[0].strip().lower()
        match = _HOST.fullmatch(host)
        if match is None or ".." in host:
            raise AddressError(400, "the Host header is not a host name with an optional port")
        hostname, port_text = match.group("name"), match.group("port")
        path, query = _split_target(raw_target)
        for zone in self._zones:
            if hostname.endswith("." + zone):
                return self._host_form(hostname.removesuffix("." + zone), zone, host, path, query)
        if self._path_origin is not None:
            scheme, origin_host, origin_port = self._path_origin
            port = int(port_text) if port_text else _DEFAULT_PORTS[scheme]
            if hostname == origin_host and port == origin_port:
                return self._path_form(scheme, host, path, query)
        raise AddressError(421, f"this kas serves no workspaces at host {hostname[:100]!r}")

    def _host_form(self, first: str, zone: str, host: str, path: str, query: str) -> WorkspaceAddress:
        origin = f"{self._host_scheme}://{host}"
        label = _LABEL.fullmatch(first)
        if label is None or int(label.group("port")) > 65535:
            raise AddressError(
                404, f"{first[:100]!r} does not name a workspace port: hosts are <port>-<workspace name>.{zone}"
            )
        name, port = label.group("name"), int(label.group("port"))
        if path == CALLBACK_PATH:
            return WorkspaceAddress("", 0, zone, origin, self._host_scheme, host, None, path, query, callback=True)
        return WorkspaceAddress(name, port, zone, origin, self._host_scheme, host, None, path, query)

    def _path_form(self, scheme: str, host: str, path: str, query: str) -> WorkspaceAddress:
        origin = f"{scheme}://{host}"
        if path == CALLBACK_PATH:
            return WorkspaceAddress("", 0, None, origin, scheme, host, None, path, query, callback=True)
        usage = f"workspaces are at {PATH_PREFIX}<workspace name>/<port>/"
        if not path.startswith(PATH_PREFIX):
            raise AddressError(404, f"no workspace at this path: {usage}")
        parts = path[len(PATH_PREFIX) :].split("/", 2)
        if len(parts) < 2 or not _NAME.fullmatch(parts[0]) or not _PORT.fullmatch(parts[1]):
            raise AddressError(404, f"no workspace at this path: {usage}")
        name, port = parts[0], int(parts[1])
        if port > 65535:
            raise AddressError(404, f"port {port} is not a port number (1-65535)")
        prefix = f"{PATH_PREFIX}{name}/{port}"
        if len(parts) == 2:
            location = f"{prefix}/?{query}" if query else f"{prefix}/"
            raise AddressError(308, f"the workspace is at {prefix}/", location)
        return WorkspaceAddress(name, port, None, origin, scheme, host, prefix, "/" + parts[2], query)
