"""kas' three gRPC listeners (kas.md §0.1): agent (agentk), api (the hub) and private api (other kas).

Every listener checks its callers before any request is decoded: agent token on the agent listener
(rate limited per token), JWT ``iss=gitlab``/``aud=gitlab-kas`` on the api listener, JWT ``iss=aud=gitlab-kas``
with a kas-only secret on the private api listener.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import grpc

from tether.kas.errors import KasStartError
from tether.modserver.agent_auth import AgentAuthenticator, AgentAuthInterceptor
from tether.modserver.config import KasConfigBase, ListenCF
from tether.tool.grpc_in_flight import InFlightInterceptor
from tether.tool.grpc_size import receive_limit_options
from tether.tool.grpc_stream import BOUNDED_WINDOW_OPTIONS, PENDING_RPC_OPTIONS
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, ISSUER_KAS, JwtServerInterceptor, JwtVerifier
from tether.tool.rate_limit import RateLimiter
from tether.tool.secrets import SecretError, load_base64_secret

__all__ = ["GrpcListeners", "Secrets", "load_secrets", "own_private_api_url"]


@dataclass(frozen=True)
class Secrets:
    """The three shared secrets: for the hub's internal API, the api listener and the private api listener."""

    gitlab: bytes
    api: bytes
    private: bytes


def load_secrets(config: KasConfigBase) -> Secrets:
    """Read the secret files of ``gitlab``, ``api.listen`` and ``private_api.listen``.

    Raises:
        KasStartError: a file cannot be read or decoded, the gitlab secret is not 32 bytes, or the private
            secret equals another one (only kas may know it).
    """
    try:
        secrets = Secrets(
            gitlab=load_base64_secret(config.gitlab.authentication_secret_file, exact_length=32),
            api=load_base64_secret(config.api.listen.authentication_secret_file),
            private=load_base64_secret(config.private_api.listen.authentication_secret_file),
        )
    except SecretError as exc:
        raise KasStartError(str(exc)) from exc
    if secrets.private in (secrets.api, secrets.gitlab):
        raise KasStartError("private_api secret must differ from the api and gitlab secrets (only kas may know it)")
    return secrets


def own_private_api_url(config: KasConfigBase) -> str:
    """This kas' private API URL: ``OWN_PRIVATE_API_URL``, else derived from the listen address (kas.md §2.7).

    Raises:
        KasStartError: the listen address is a wildcard and no URL was given.
    """
    explicit = os.environ.get("OWN_PRIVATE_API_URL")
    if explicit:
        return explicit
    listen = config.private_api.listen
    if listen.network == "unix":
        return f"unix://{listen.address}"
    host, _, port = listen.address.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        raise KasStartError(
            f"private_api.listen.address {listen.address!r} is a wildcard: set OWN_PRIVATE_API_URL "
            "to the URL other kas instances should use, e.g. grpc://10.0.0.5:8155"
        )
    scheme = "grpcs" if listen.certificate_file else "grpc"
    return f"{scheme}://{host}:{port}"


def _server_options(max_connection_age_s: float, max_message_size: int) -> list[tuple[str, Any]]:
    return [
        # Core refuses a larger message on its length prefix, before reading it (issue 27, tool/grpc_size).
        *receive_limit_options(max_message_size),
        # Nothing reads channelz; its per-connection node is ~0.5 KiB (bench/grpc_floor.py, issue 9).
        ("grpc.enable_channelz", 0),
        # kas.md §8.3: ping every 50 s; clients may ping every 20 s, also without calls.
        ("grpc.keepalive_time_ms", 50_000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 20_000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_connection_age_ms", int(max_connection_age_s * 0.2 * 1000)),
        ("grpc.max_connection_age_grace_ms", int(max_connection_age_s * 0.65 * 1000)),
        # grpcio binds with SO_REUSEPORT by default: a port another listener (or another process of the same
        # user) holds would be shared silently, connections split at random between the two.
        ("grpc.so_reuseport", 0),
        *BOUNDED_WINDOW_OPTIONS,
        *PENDING_RPC_OPTIONS,
    ]


def _bind(server: grpc.aio.Server, listen: ListenCF, name: str) -> int:
    address = f"unix:{listen.address}" if listen.network == "unix" else listen.address
    try:
        if listen.certificate_file and listen.key_file:
            credentials = grpc.ssl_server_credentials(
                [(listen.key_file.read_bytes(), listen.certificate_file.read_bytes())]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise KasStartError(f"{name} listener cannot listen on {listen.address}: {exc}") from exc
    if port == 0 and listen.network != "unix":
        raise KasStartError(f"{name} listener cannot listen on {listen.address} (address in use?)")
    return port


class GrpcListeners:
    """The agent, api and private api gRPC servers; modules register their services before :meth:`bind`.

    Args:
        config: the validated configuration.
        secrets: the shared secrets (:func:`load_secrets`).
        auth: agent token authentication for the agent listener.
        rate_limiter: limits new agent connections per token.
    """

    def __init__(
        self, config: KasConfigBase, secrets: Secrets, auth: AgentAuthenticator, rate_limiter: RateLimiter
    ) -> None:
        self._config = config
        agent = config.agent
        self.agent = self._server(
            agent.listen.max_connection_age,
            AgentAuthInterceptor(auth, rate_limiter, agent.listen.connections_per_token_per_minute),
        )
        self.api = self._server(
            config.api.listen.max_connection_age,
            JwtServerInterceptor(JwtVerifier(secrets.api, AUDIENCE_KAS, ISSUER_GITLAB)),
        )
        self.private = self._server(
            config.private_api.listen.max_connection_age,
            JwtServerInterceptor(JwtVerifier(secrets.private, AUDIENCE_KAS, ISSUER_KAS)),
        )

    def _server(self, max_connection_age_s: float, interceptor: grpc.aio.ServerInterceptor) -> grpc.aio.Server:
        return grpc.aio.server(
            options=_server_options(max_connection_age_s, self._config.agent.listen.max_message_size),
            interceptors=[InFlightInterceptor(), interceptor],
        )

    def bind(self) -> dict[str, int]:
        """Bind the three listeners; returns listener name -> bound TCP port (0 for unix sockets).

        Raises:
            KasStartError: an address cannot be bound.
        """
        config = self._config
        return {
            "agent": _bind(self.agent, config.agent.listen, "agent"),
            "api": _bind(self.api, config.api.listen, "api"),
            "private_api": _bind(self.private, config.private_api.listen, "private_api"),
        }

    async def start(self) -> None:
        """Start serving on the bound addresses."""
        for server in (self.agent, self.api, self.private):
            await server.start()
