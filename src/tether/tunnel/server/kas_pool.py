"""Connections from one kas to the others' private API, one gRPC channel per URL (kas.md §2.7).

URLs: ``grpc://host:port`` (plaintext), ``grpcs://host:port`` (TLS with the configured CA), ``unix://path``.
Every RPC carries ``authorization: Bearer <JWT>`` with ``iss=aud=gitlab-kas`` valid for 5 s from the current
second, signed with the secret only kas instances share (kas.md §4.3), once a second (``SecondSigner``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from tether.tool.backoff import channel_reconnect_options
from tether.tool.grpc_stream import BOUNDED_WINDOW_OPTIONS
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_KAS, SecondSigner

_JWT_LIFETIME_S = 5.0
#: A channel unused this long and not connected is closed (its kas probably left).
IDLE_CLOSE_S = 60.0


class KasUrlError(ValueError):
    """A private API URL has an unknown scheme or no host/port."""


def channel_target(url: str) -> tuple[str, bool]:
    """Return (gRPC target, use TLS) for a private API URL.

    Raises:
        KasUrlError: for unsupported schemes or missing host.
    """
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}", False
    if parts.scheme not in ("grpc", "grpcs") or not parts.hostname:
        raise KasUrlError(
            f"unsupported private API URL {url!r} (want grpc://host:port, grpcs://host:port or unix://path)"
        )
    port = parts.port or (443 if parts.scheme == "grpcs" else 80)
    return f"{parts.hostname}:{port}", parts.scheme == "grpcs"


class KasPool:
    """Lazily opened channels to other kas instances, reused for every call.

    Args:
        secret: private API JWT secret.
        ca_file: CA certificate for ``grpcs://`` URLs, or None for the system roots.
        max_message_size: largest message in bytes in either direction.
        tls_server_name: TLS server name override (``OWN_PRIVATE_API_HOST`` upstream).
    """

    def __init__(
        self, secret: bytes, ca_file: Path | None, max_message_size: int, tls_server_name: str | None = None
    ) -> None:
        self._jwt = SecondSigner(secret, ISSUER_KAS, AUDIENCE_KAS, _JWT_LIFETIME_S)
        self._ca = ca_file.read_bytes() if ca_file else None
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_size),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.keepalive_time_ms", 55_000),
            ("grpc.keepalive_permit_without_calls", 1),
            *channel_reconnect_options(),
            *BOUNDED_WINDOW_OPTIONS,
        ]
        if tls_server_name:
            self._options.append(("grpc.ssl_target_name_override", tls_server_name))
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._last_used: dict[str, float] = {}

    def channel(self, url: str) -> grpc.aio.Channel:
        """Return the channel for ``url``, opening it on first use.

        Raises:
            KasUrlError: malformed URL.
        """
        channel = self._channels.get(url)
        if channel is None:
            target, tls = channel_target(url)
            if tls:
                credentials = grpc.ssl_channel_credentials(root_certificates=self._ca)
                channel = grpc.aio.secure_channel(target, credentials, options=self._options)
            else:
                channel = grpc.aio.insecure_channel(target, options=self._options)
            self._channels[url] = channel
        self._last_used[url] = time.monotonic()
        return channel

    @property
    def urls(self) -> list[str]:
        """URLs with an open channel."""
        return list(self._channels)

    async def close_unused(self, idle_s: float = IDLE_CLOSE_S) -> list[str]:
        """Close the channels not used for ``idle_s`` seconds that are not connected (their kas left).

        Returns:
            the URLs whose channels were closed.
        """
        now = time.monotonic()
        closed: list[str] = []
        for url, channel in list(self._channels.items()):
            idle = now - self._last_used.get(url, now) >= idle_s
            if idle and channel.get_state(try_to_connect=False) is not grpc.ChannelConnectivity.READY:
                del self._channels[url]
                self._last_used.pop(url, None)
                await channel.close()
                closed.append(url)
        return closed

    def auth_metadata(self) -> tuple[tuple[str, str], ...]:
        """The per-RPC bearer JWT for the private API (the current second's)."""
        return (("authorization", "Bearer " + self._jwt.token()),)

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._last_used.clear()
