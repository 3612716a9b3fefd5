"""agentk settings from its command line and environment (kas.md §4.1, §8.1-8.3).

Pure parsing and validation: every function raises :class:`AgentkConfigError` with a message fit for
the user; ``command.py`` turns it into a CLI error.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tether.tool.backoff import channel_reconnect_options
from tether.tool.grpc_stream import BOUNDED_WINDOW_OPTIONS

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "KEEPALIVE_TIME_S",
    "SHUTDOWN_GRACE_S",
    "TOKEN_ENV",
    "AgentkConfig",
    "AgentkConfigError",
    "KasAddress",
    "kas_headers",
    "parse_kas_address",
    "parse_kas_header",
    "parse_listen_address",
    "read_token",
]

TOKEN_ENV = "AGENTK_TOKEN"
#: Client keepalive ping interval, seconds, also without active calls (kas.md §8.3).
KEEPALIVE_TIME_S = 55.0
#: In-flight tunnelled calls may finish for this many seconds on SIGTERM/SIGINT.
SHUTDOWN_GRACE_S = 10.0
#: Default gRPC message size limit in both directions, bytes (kas' agent listener default).
DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024

# gRPC metadata keys: lower-case letters, digits, "-", "_", "." (the HTTP/2 header rules gRPC uses).
_METADATA_KEY = re.compile(r"^[0-9a-z_.-]+$")
_RESERVED_KEYS = frozenset({"authorization", "content-type", "te", "user-agent", "grpc-timeout"})


class AgentkConfigError(ValueError):
    """An invalid flag or environment value; the message says which and why."""


@dataclass(frozen=True)
class KasAddress:
    """Where kas' agent listener is.

    Attributes:
        target: gRPC target, ``dns:///host:port`` (round-robin over the resolved addresses, kas.md §8.2).
        tls: whether to use TLS (``grpcs``).
        host: host part, for error messages.
    """

    target: str
    tls: bool
    host: str


@dataclass(frozen=True)
class AgentkConfig:
    """Everything ``tether agentk`` needs to run.

    Attributes:
        kas: kas agent listener address.
        token: agent token (secret; never logged).
        ca_cert: PEM bytes of the CA for ``grpcs`` (None: system roots).
        kas_headers: extra metadata pairs sent on every call to kas.
        kubeconfig: kubeconfig path(s) (``:``-separated), or None for the in-cluster service account.
        observability_host: HTTP host for ``/metrics``, ``/liveness``, ``/readiness`` (empty: all interfaces).
        observability_port: its TCP port.
        max_receive_message_bytes: largest gRPC message accepted, bytes.
        max_send_message_bytes: largest gRPC message sent, bytes.
        shutdown_grace_s: seconds in-flight tunnelled calls may run after SIGTERM/SIGINT.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
    """

    kas: KasAddress
    token: str = field(repr=False)
    ca_cert: bytes | None = None
    kas_headers: tuple[tuple[str, str], ...] = ()
    kubeconfig: str | None = None
    observability_host: str = "127.0.0.1"
    observability_port: int = 8080
    max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    log_level: str = "info"

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """Per-RPC metadata for every call to kas: the bearer token (kas.md §4.1), then ``--kas-header`` pairs."""
        return (("authorization", f"Bearer {self.token}"), *self.kas_headers)

    def channel_options(self) -> list[tuple[str, Any]]:
        """``grpc.aio`` channel options for kas: keepalive 55 s (§8.3), message limits, reconnect backoff <= 2 s."""
        return [
            ("grpc.keepalive_time_ms", int(KEEPALIVE_TIME_S * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            # Keep pinging an idle connection; by default gRPC stops after two pings without data.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.lb_policy_name", "round_robin"),
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
            *channel_reconnect_options(),
            *BOUNDED_WINDOW_OPTIONS,
        ]


def parse_kas_address(address: str) -> KasAddress:
    """Parse ``--kas-address``: ``grpc://host:port`` (plaintext) or ``grpcs://host:port`` (TLS).

    The port defaults to 80 / 443 like upstream's URL handling would for HTTP/2.

    Raises:
        AgentkConfigError: empty, unknown scheme, ``ws``/``wss`` (not supported yet), or no host.
    """
    if not address:
        raise AgentkConfigError("--kas-address is required")
    if "," in address:
        return _parse_address_list(address)
    parts = urlsplit(address)
    scheme = parts.scheme.lower()
    if scheme in ("ws", "wss"):
        raise AgentkConfigError(
            f"--kas-address {address!r}: the {scheme}:// scheme is not supported yet; use grpc:// or grpcs://"
        )
    if scheme not in ("grpc", "grpcs"):
        raise AgentkConfigError(f"--kas-address {address!r}: scheme must be grpc:// or grpcs://")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise AgentkConfigError(f"--kas-address {address!r}: {exc}") from exc
    if not host:
        raise AgentkConfigError(f"--kas-address {address!r}: missing host")
    if parts.path not in ("", "/") or parts.query:
        raise AgentkConfigError(f"--kas-address {address!r}: a path or query is not allowed for {scheme}://")
    tls = scheme == "grpcs"
    port = port or (443 if tls else 80)
    shown = f"[{host}]" if ":" in host else host
    return KasAddress(target=f"dns:///{shown}:{port}", tls=tls, host=host)


def _parse_address_list(address: str) -> KasAddress:
    """``grpc://ip:port,ip:port``: a static list of kas replicas (Tether addition, for set-ups without DNS).

    gRPC's ``ipv4:`` resolver only takes IP literals, so host names must come from DNS instead.
    """
    scheme, sep, rest = address.partition("://")
    if not sep or scheme.lower() not in ("grpc", "grpcs"):
        raise AgentkConfigError(f"--kas-address {address!r}: scheme must be grpc:// or grpcs://")
    endpoints = []
    for item in rest.rstrip("/").split(","):
        host, _, port = item.rpartition(":")
        try:
            ipaddress.IPv4Address(host)
        except ValueError as exc:
            raise AgentkConfigError(
                f"--kas-address {address!r}: a list of kas addresses must be IPv4 host:port pairs ({item!r} is not); "
                "use a DNS name that resolves to every replica instead"
            ) from exc
        if not port.isdigit():
            raise AgentkConfigError(f"--kas-address {address!r}: {item!r} needs a port")
        endpoints.append(f"{host}:{port}")
    return KasAddress(target="ipv4:" + ",".join(endpoints), tls=scheme.lower() == "grpcs", host=endpoints[0])


def read_token(token_file: Path | None, env: MutableMapping[str, str] | None = None) -> str:
    """The agent token from ``--token-file`` or ``AGENTK_TOKEN`` (kas.md §4.1).

    The variable is removed from ``env`` after reading, so child processes never see it; one trailing
    newline (LF or CRLF) of the file is trimmed.

    Raises:
        AgentkConfigError: both or neither given, unreadable file, or an empty token.
    """
    env = os.environ if env is None else env
    from_env = env.pop(TOKEN_ENV, None)
    if token_file is not None and from_env is not None:
        raise AgentkConfigError(f"--token-file and {TOKEN_ENV} are both set; use only one")
    if token_file is not None:
        try:
            token = token_file.read_text()
        except OSError as exc:
            raise AgentkConfigError(f"cannot read --token-file {token_file}: {exc.strerror or exc}") from exc
        token = token.removesuffix("\n").removesuffix("\r")
    elif from_env is not None:
        token = from_env
    else:
        raise AgentkConfigError(f"an agent token is required: pass --token-file or set {TOKEN_ENV}")
    if not token:
        raise AgentkConfigError("the agent token is empty")
    return token


def parse_kas_header(value: str) -> tuple[str, str]:
    """Parse one ``--kas-header "Key: Value"`` into a metadata pair (key lower-cased, as gRPC requires).

    Raises:
        AgentkConfigError: no ``:``, an invalid or reserved key (``authorization`` is set from the token).
    """
    key, sep, rest = value.partition(":")
    key = key.strip().lower()
    if not sep or not key:
        raise AgentkConfigError(f"--kas-header {value!r}: expected 'Key: Value'")
    if not _METADATA_KEY.match(key) or key.startswith("grpc-") or key in _RESERVED_KEYS:
        raise AgentkConfigError(f"--kas-header {value!r}: {key!r} cannot be used as a gRPC metadata key")
    return key, rest.strip()


def parse_listen_address(value: str) -> tuple[str, int]:
    """Parse ``host:port`` (``:port`` or ``[::1]:port`` too) into ``(host, port)``; empty host = all interfaces.

    Raises:
        AgentkConfigError: no port, or a port outside 0-65535.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise AgentkConfigError(f"listen address {value!r}: expected host:port")
    return host.removeprefix("[").removesuffix("]"), int(port_text)


def kas_headers(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Parse every ``--kas-header`` value; see :func:`parse_kas_header`."""
    return tuple(parse_kas_header(v) for v in values)
