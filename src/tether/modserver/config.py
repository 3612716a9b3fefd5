"""kas configuration: one YAML file whose field names mirror upstream kascfg (kas.md §7).

Secrets are never inline: every secret is a path to a base64 file. Every field has a default except the
JWT secret files; ``redis`` may be omitted, which selects the in-memory backend for a single kas (the
embedded default). Tether additions are marked in ``docs/configuration.md``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tether.tool.durations import Duration

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenCF(_Section):
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


class AgentConfigurationCF(_Section):
    """GetConfiguration behaviour."""

    poll_period: Duration = 300.0
    max_configuration_file_size: int = 131072


class KubernetesApiListenCF(ListenCF):
    """The Kubernetes API proxy's HTTP listener (kas.md §5.1); TLS when both certificate and key are set."""

    address: str = "0.0.0.0:8154"
    #: After SIGTERM, how long the listener still accepts requests (upstream ``listen_grace_period``).
    listen_grace_period: Duration = 5.0
    #: After SIGTERM, how long in-flight requests (watches, exec sessions) may continue before being cut.
    shutdown_grace_period: Duration = 3600.0


class KubernetesApiCF(_Section):
    """The Kubernetes API proxy (kas.md §5, §7 ``agent.kubernetes_api``); the section's absence turns it off."""

    listen: KubernetesApiListenCF = KubernetesApiListenCF()
    #: Requests must be under this path; it is stripped (keeping a leading ``/``) before forwarding.
    url_path_prefix: str = "/"
    #: How long a successful ``authorize_proxy_user`` answer is reused for the same credentials.
    allowed_agent_cache_ttl: Duration = 60.0
    #: How long a refusal (hub 401/403/404) is reused for the same credentials.
    allowed_agent_cache_error_ttl: Duration = 10.0
    #: Tether addition (issue 9 item 4): refused credentials per client address and minute, over every kas
    #: sharing Redis, before the address gets 429 without a hub call; 0 turns the throttle off. Behind a proxy
    #: or load balancer every client shares its address: raise the limit or throttle there.
    failed_auth_per_source_per_minute: int = Field(default=60, ge=0)

    @field_validator("url_path_prefix")
    @classmethod
    def _normalize_prefix(cls, value: str) -> str:
        # kas.md §5.1: always normalised to end with "/".
        if not value.startswith("/"):
            raise ValueError(f"url_path_prefix {value!r} must start with '/'")
        return value if value.endswith("/") else value + "/"


class WorkspacesListenCF(ListenCF):
    """The workspaces' HTTP listener (issue 13); TLS when both certificate and key are set."""

    address: str = "0.0.0.0:8156"
    #: After SIGTERM, how long the listener still accepts requests.
    listen_grace_period: Duration = 5.0
    #: After SIGTERM, how long in-flight requests (downloads, an editor's WebSockets) may continue before being cut.
    shutdown_grace_period: Duration = 60.0


class WorkspacesCF(_Section):
    """Tether addition (issue 13): users reach their workspaces through kas; the section's absence turns it off.

    A workspace port is served at ``<port>-<workspace name>.<zone>`` for each zone of ``dns_zones`` (wildcard
    DNS and certificate), and at ``<path_url>/-/workspaces/<workspace name>/<port>/`` when ``path_url`` is set.
    """

    listen: WorkspacesListenCF = WorkspacesListenCF()
    #: DNS zones whose hosts name workspace ports (the agents' ``remote_development.dns_zone``), e.g.
    #: ``workspaces.example.com``; lower case, no leading dot.
    dns_zones: list[str] = Field(default_factory=list)
    #: Scheme users reach the zones' hosts with; None: ``https`` when the listener has TLS, else ``http``
    #: (set ``https`` behind a load balancer that ends TLS).
    host_scheme: Literal["http", "https"] | None = None
    #: Origin of the path form as users reach it (``https://kas.example.com``), or None for no path form.
    path_url: str | None = None
    #: The hub's sign-in for workspaces as browsers reach it; None: ``<gitlab.external_url or address>``
    #: followed by ``/-/workspaces/authorize``.
    sign_in_url: str | None = None
    #: How long the hub's answer about a user and a workspace is reused (a state change ends it at once).
    authorization_cache_ttl: Duration = 10.0
    #: How long a refusal (unknown credentials, not the owner) is reused.
    authorization_cache_error_ttl: Duration = 5.0
    #: How long a request waits for a tunnel to the workspace's agent before answering 502.
    agent_timeout: Duration = 10.0
    #: How long the workspace may take to send its response head; then 504.
    response_header_timeout: Duration = 120.0
    #: Refused credentials per client address and minute (all kas together) before 429; 0 turns it off.
    failed_auth_per_source_per_minute: int = Field(default=60, ge=0)

    @field_validator("dns_zones")
    @classmethod
    def _zones(cls, value: list[str]) -> list[str]:
        zones = []
        for given in value:
            zone = given.strip().lower().rstrip(".")
            labels = zone.split(".")
            if len(labels) < 2 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
                raise ValueError(f"dns zone {zone[:100]!r} must be a DNS name of at least two labels")
            zones.append(zone)
        return zones

    @model_validator(mode="after")
    def _serves_something(self) -> WorkspacesCF:
        if not self.dns_zones and self.path_url is None:
            raise ValueError("set dns_zones (host form) or path_url (path form), or remove the section")
        return self

    @field_validator("path_url")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.rstrip("/")
        scheme, sep, rest = value.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or "/" in rest or "?" in rest or "#" in rest:
            raise ValueError(f"path_url {value[:100]!r} must be an origin: http(s)://host[:port], without a path")
        return value


class AgentCF(_Section):
    """Everything about agent connections."""

    listen: AgentListenCF = AgentListenCF()
    configuration: AgentConfigurationCF = AgentConfigurationCF()
    kubernetes_api: KubernetesApiCF | None = None
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


class GitlabCF(_Section):
    """The control plane (the hub) that serves the internal API."""

    address: str = "http://127.0.0.1:8080"
    external_url: str | None = None
    authentication_secret_file: Path
    ca_certificate_file: Path | None = None
    #: Tether addition: deadline of each internal API call, from connecting to the end of the answer.
    request_timeout: Duration = Field(default=20.0, gt=0)


class UrlPathCF(_Section):
    """An HTTP path."""

    url_path: str


class ObservabilityListenCF(ListenCF):
    """Observability HTTP listener."""

    address: str = "127.0.0.1:8151"


class LoggingCF(_Section):
    """Log levels."""

    level: Literal["debug", "info", "warn", "error"] = "info"
    grpc_level: Literal["debug", "info", "warn", "error"] = "error"


class ObservabilityCF(_Section):
    """/metrics, /liveness, /readiness and logging."""

    listen: ObservabilityListenCF = ObservabilityListenCF()
    prometheus: UrlPathCF = UrlPathCF(url_path="/metrics")
    liveness_probe: UrlPathCF = UrlPathCF(url_path="/liveness")
    readiness_probe: UrlPathCF = UrlPathCF(url_path="/readiness")
    logging: LoggingCF = LoggingCF()


class RedisServerCF(_Section):
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


class RedisSentinelCF(_Section):
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


class RedisTlsCF(_Section):
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


class RedisCF(_Section):
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


class ApiCF(_Section):
    """api gRPC listener (the hub -> kas)."""

    listen: ApiListenCF


class PrivateApiListenCF(ListenCF):
    """The kas -> kas listener."""

    address: str = "127.0.0.1:8155"
    authentication_secret_file: Path
    ca_certificate_file: Path | None = None
    max_connection_age: Duration = 7200.0
    listen_grace_period: Duration = 5.0


class PrivateApiCF(_Section):
    """private api gRPC listener (kas -> kas)."""

    listen: PrivateApiListenCF


class RoutingCF(_Section):
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


class KasConfig(_Section):
    """The whole kas configuration file."""

    gitlab: GitlabCF
    agent: AgentCF = AgentCF()
    observability: ObservabilityCF = ObservabilityCF()
    redis: RedisCF | None = None
    api: ApiCF
    private_api: PrivateApiCF
    routing: RoutingCF = RoutingCF()
    workspaces: WorkspacesCF | None = None


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message names the file and each bad field."""


def load_config(path: Path) -> KasConfig:
    """Read and validate a kas YAML configuration file.

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
        return KasConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(f"invalid kas configuration in {path}:\n" + "\n".join(lines)) from exc
