"""kas configuration, the shared part: one YAML file whose field names mirror upstream kascfg (kas.md §7).

This file holds what kas itself and every module use (listeners, the hub, Redis, observability, routing);
each module declares its own section and defaults in its own folder (``modules/<name>/.../config.py``), and
``tether.kas.config`` puts the whole file together (issue 24 item 4).

Secrets are never inline: every secret is a path to a base64 file. Every field has a default except the
JWT secret files; ``redis`` may be omitted, which selects the in-memory backend for a single kas (the
embedded default). Tether additions are marked in ``docs/configuration.md``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tether.tool.durations import Duration
from tether.tool.tracing_config import TracingCF


class Section(BaseModel):
    """A configuration section: unknown keys are refused, values are frozen (shared by the modules' sections)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenCF(Section):
    """A network listener: ``address`` is ``host:port`` (tcp) or a socket path (unix)."""

    network: Literal["tcp", "unix"] = "tcp"
    address: str
    certificate_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> ListenCF:
        if (self.certificate_file is None) != (self.key_file is None):
            raise ValueError("certificate_file and key_file must be set together")
        return self


class AgentListenCF(ListenCF):
    """agentk-facing gRPC listener."""

    address: str = "127.0.0.1:8150"
    max_connection_age: Duration = 7200.0
    listen_grace_period: Duration = 5.0
    connections_per_token_per_minute: int = Field(default=40000, ge=0)
    #: Tether addition: largest gRPC message accepted on this listener, in bytes.
    max_message_size: int = Field(default=10 * 1024 * 1024, ge=1024)
    #: Tether addition: most tunnels one agent may hold on this kas (all its agentk replicas together).
    max_tunnels_per_agent: int = Field(default=2000, ge=1)
    #: Tether addition: most tunnels one connection (one agentk replica) may hold; agentk opens at most 500.
    max_tunnels_per_connection: int = Field(default=500, ge=1)


class AgentCF(Section):
    """Everything about agent connections that kas itself uses (the modules' parts: ``tether.kas.config``)."""

    listen: AgentListenCF = AgentListenCF()
    info_cache_ttl: Duration = 300.0
    info_cache_error_ttl: Duration = 60.0
    #: Tether addition (issue 27 item 6): how often kas re-checks the tokens it trusts against the revocation
    #: list in Redis (and, once their cached answer expired, tokens holding tunnels or streams against the hub).
    token_revalidation_period: Duration = Field(default=30.0, gt=0, le=60.0)
    redis_conn_info_ttl: Duration = 300.0
    redis_conn_info_refresh: Duration = 240.0
    redis_conn_info_gc: Duration = 600.0

    @model_validator(mode="after")
    def _refresh_before_expiry(self) -> AgentCF:
        if self.redis_conn_info_refresh >= self.redis_conn_info_ttl:
            raise ValueError("redis_conn_info_refresh must be shorter than redis_conn_info_ttl")
        return self


class GitlabCF(Section):
    """The control plane (the hub) that serves the internal API."""

    address: str = "http://127.0.0.1:8080"
    external_url: str | None = None
    authentication_secret_file: Path
    ca_certificate_file: Path | None = None
    #: Tether addition: deadline of each internal API call, from connecting to the end of the answer.
    request_timeout: Duration = Field(default=20.0, gt=0)


class UrlPathCF(Section):
    """An HTTP path."""

    url_path: str


class ObservabilityListenCF(ListenCF):
    """Observability HTTP listener."""

    address: str = "127.0.0.1:8151"


class LoggingCF(Section):
    """Log levels."""

    level: Literal["debug", "info", "warn", "error"] = "info"
    grpc_level: Literal["debug", "info", "warn", "error"] = "error"


class ObservabilityCF(Section):
    """/metrics, /liveness, /readiness, logging and tracing (``tracing``: OTLP export, off by default)."""

    listen: ObservabilityListenCF = ObservabilityListenCF()
    prometheus: UrlPathCF = UrlPathCF(url_path="/metrics")
    liveness_probe: UrlPathCF = UrlPathCF(url_path="/liveness")
    readiness_probe: UrlPathCF = UrlPathCF(url_path="/readiness")
    logging: LoggingCF = LoggingCF()
    tracing: TracingCF = TracingCF()


class RedisServerCF(Section):
    """A single Redis server."""

    address: str


#: ``host:port`` or ``[v6]:port`` of a sentinel, optionally behind ``tcp://`` (the GitLab chart writes that form).
_SENTINEL_ADDRESS = re.compile(r"(?:tcp://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")


def sentinel_host_port(address: str) -> tuple[str, int]:
    """Split a ``redis.sentinel.addresses`` entry into host and port (brackets of an IPv6 host removed).

    Raises:
        ValueError: not ``[tcp://]host:port`` with a port in 1..65535.
    """
    match = _SENTINEL_ADDRESS.fullmatch(address)
    port = int(match["port"]) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise ValueError(f"sentinel address {address!r} is not host:port (or tcp://host:port)")
    return match["host"].strip("[]"), port


class RedisSentinelCF(Section):
    """A master found through Redis Sentinel (upstream ``RedisSentinelCF``, kas.md §3.1)."""

    #: The name the sentinels monitor the master under (``sentinel monitor <master_name> ...``).
    master_name: str = Field(min_length=1)
    #: Sentinels to ask, ``host:port`` each; any one that answers is enough.
    addresses: list[str] = Field(min_length=1)
    #: File holding the password of the sentinels themselves (their ``requirepass``); None: no AUTH to them.
    sentinel_password_file: Path | None = None

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, addresses: list[str]) -> list[str]:
        for address in addresses:
            sentinel_host_port(address)
        return addresses


class RedisTlsCF(Section):
    """TLS to Redis and to the sentinels (upstream ``RedisTLSCF``)."""

    enabled: bool = False
    #: Client certificate and key, for servers that verify clients (``tls-auth-clients yes``).
    certificate_file: Path | None = None
    key_file: Path | None = None
    #: CA that signed the servers' certificates; None: the system's CAs.
    ca_certificate_file: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> RedisTlsCF:
        if (self.certificate_file is None) != (self.key_file is None):
            raise ValueError("certificate_file and key_file must be set together")
        return self


class RedisCF(Section):
    """Redis connection; omit the whole section to use the in-memory backend (one kas only).

    Exactly one of ``server`` (one Redis server) and ``sentinel`` (a master found through Redis Sentinel).
    """

    server: RedisServerCF | None = None
    sentinel: RedisSentinelCF | None = None
    tls: RedisTlsCF = RedisTlsCF()
    dial_timeout: Duration = 5.0
    write_timeout: Duration = 3.0
    key_prefix: str = "gitlab-kas"
    username: str | None = None
    password_file: Path | None = None
    database_index: int = Field(default=0, ge=0)
    network: Literal["tcp", "unix"] = "tcp"
    pool_size: int = Field(default=256, ge=1)
    pool_timeout: Duration = 5.0

    @model_validator(mode="after")
    def _one_target(self) -> RedisCF:
        if (self.server is None) == (self.sentinel is None):
            raise ValueError("set exactly one of redis.server and redis.sentinel")
        if self.sentinel is not None and self.network == "unix":
            raise ValueError("redis.network unix cannot be used with redis.sentinel (sentinels name TCP addresses)")
        return self


class ApiListenCF(ListenCF):
    """The api listener the hub calls."""

    address: str = "127.0.0.1:8153"
    authentication_secret_file: Path
    max_connection_age: Duration = 7200.0
    listen_grace_period: Duration = 5.0


class ApiCF(Section):
    """api gRPC listener (the hub -> kas)."""

    listen: ApiListenCF


class PrivateApiListenCF(ListenCF):
    """The kas -> kas listener."""

    address: str = "127.0.0.1:8155"
    authentication_secret_file: Path
    ca_certificate_file: Path | None = None
    max_connection_age: Duration = 7200.0
    listen_grace_period: Duration = 5.0


class PrivateApiCF(Section):
    """private api gRPC listener (kas -> kas)."""

    listen: PrivateApiListenCF


class RoutingCF(Section):
    """Tether addition: routing timings (upstream constants, kas.md §2.5)."""

    #: How long a request without its own deadline waits for a tunnel.
    tunnel_find_timeout: Duration = 20.0
    #: Try the next gateway kas when the last one has not answered for this long.
    try_new_kas_interval: Duration = 0.01
    #: Safety-net re-read of the tunnel tracker while waiting (pub/sub is the primary wake-up).
    recheck_interval: Duration = 2.0
    #: How long in-flight forwarded calls may continue after SIGTERM.
    shutdown_grace_period: Duration = 30.0
    #: After SIGTERM, how long kas waits for its agents to open tunnels on another kas before it ends their
    #: remaining idle tunnels (within ``shutdown_grace_period``; docs/deployment.md "Rolling updates of kas").
    agent_move_timeout: Duration = 5.0


class KasConfigBase(Section):
    """The sections of the kas configuration file that kas itself uses (the whole file: ``tether.kas.config``)."""

    gitlab: GitlabCF
    agent: AgentCF = AgentCF()
    observability: ObservabilityCF = ObservabilityCF()
    redis: RedisCF | None = None
    api: ApiCF
    private_api: PrivateApiCF
    routing: RoutingCF = RoutingCF()


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message names the file and each bad field."""


M = TypeVar("M", bound=BaseModel)


def load_yaml(path: Path, model: type[M]) -> M:
    """Read and validate a YAML configuration file as ``model``.

    Raises:
        ConfigError: with one line per problem, e.g. ``agent.listen.max_connection_age: invalid duration``.
    """
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(f"invalid kas configuration in {path}:\n" + "\n".join(lines)) from exc
