"""The hub's configuration: a YAML file, environment overrides, then command-line overrides.

Precedence (highest first): command-line options, ``TETHER_HUB_*`` environment variables, the file, defaults.
Unknown fields are errors and every error names its field. Secrets are never inline: each is a path to a file
holding base64 text (kas.md §4.2).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tether.hub.db.engine import DatabaseUrlError, check_url
from tether.modules.remote_development.hub.devfile import default_devfile
from tether.tool.durations import Duration
from tether.tool.tracing_config import TracingCF

DEFAULT_DATA_DIR = Path("~/.local/share/tether").expanduser()
DEFAULT_LISTEN = "127.0.0.1:8080"
_COOKIE_DOMAIN = re.compile(r"\.?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*")

#: Environment variable -> dotted configuration field.
ENV_OVERRIDES = {
    "TETHER_HUB_LISTEN": "listen",
    "TETHER_HUB_DATA_DIR": "data_dir",
    "TETHER_HUB_DATABASE_URL": "database.url",
    "TETHER_HUB_AUTO_MIGRATE": "database.auto_migrate",
    "TETHER_HUB_EXTERNAL_URL": "external_url",
    "TETHER_HUB_GITLAB_SECRET_FILE": "gitlab.authentication_secret_file",
    "TETHER_HUB_KAS_API_ADDRESS": "kas.api_address",
    "TETHER_HUB_KAS_API_SECRET_FILE": "kas.authentication_secret_file",
    "TETHER_HUB_KAS_EXTERNAL_URL": "kas.external_url",
    "TETHER_HUB_GITALY_LISTEN": "gitaly.listen",
    "TETHER_HUB_GITALY_ADDRESS": "gitaly.address",
    "TETHER_HUB_GITALY_TOKEN_FILE": "gitaly.token_file",
    "TETHER_HUB_LOG_LEVEL": "logging.level",
    "TETHER_HUB_SESSION_LIFETIME": "sessions.lifetime",
    "TETHER_HUB_KAS_COOKIE_DOMAIN": "sessions.kas_cookie_domain",
    "TETHER_HUB_KAS_K8S_PROXY_URL": "kas.k8s_proxy_url",
    "TETHER_HUB_KAS_K8S_PROXY_CA_FILE": "kas.k8s_proxy_ca_certificate_file",
    "TETHER_HUB_KAS_WORKSPACES_URL": "kas.workspaces_url",
    "TETHER_HUB_MAX_ACTIVE_WORKSPACES_PER_USER": "workspaces.max_active_workspaces_per_user",
    "TETHER_HUB_WORKSPACES_DEFAULT_DEVFILE_IMAGE": "workspaces.default_devfile_image",
    "TETHER_HUB_AUDIT_RETENTION_DAYS": "audit.retention_days",
}


class ConfigError(ValueError):
    """The configuration is unreadable or invalid; the message names the file and the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseCF(_Section):
    """Where the data lives.

    Attributes:
        url: async SQLAlchemy URL; None means the SQLite file ``<data_dir>/hub.db``.
        auto_migrate: apply pending migrations when the hub (or a CLI command) starts.
    """

    url: str | None = None
    auto_migrate: bool = True


class GitlabCF(_Section):
    """The internal API kas calls (kas' ``gitlab`` section points here).

    Attributes:
        authentication_secret_file: base64 file, 32 bytes decoded, shared with kas; None means
            ``<data_dir>/gitlab_secret``, created with a random secret when missing.
    """

    authentication_secret_file: Path | None = None


class KasCF(_Section):
    """kas' api listener, which the hub calls to list connected agents.

    Attributes:
        api_address: ``host:port`` of kas' ``api.listen``; None disables the calls.
        authentication_secret_file: base64 file of kas' ``api.listen.authentication_secret_file``; None means the
            gitlab secret (upstream deploys one secret for both directions).
        ca_certificate_file: PEM CA for a TLS api listener; None means plaintext.
        timeout: seconds to wait for kas per call.
        external_url: the address agents dial (``grpc://``, ``grpcs://``, ``ws://`` or ``wss://``), published
            in ``GET /api/v4/metadata`` as ``kas.externalUrl``; None reports kas as not enabled.
        version: the kas version published as ``kas.version``; None means the hub's own version.
        k8s_proxy_url: kas' Kubernetes API proxy as users reach it, ending with its ``url_path_prefix``
            (``https://kas.example.com/k8s-proxy/``): the web console's kubectl snippet and graph relay use it,
            and ``GET /api/v4/metadata`` publishes it as ``kas.externalK8sProxyUrl`` (glab); None hides them.
        k8s_proxy_ca_certificate_file: PEM CA of that proxy's certificate, for the console's graph relay and
            the kubectl snippet; None means the system's trusted CAs.
        workspaces_url: kas' workspace listener as users reach it, for set-ups without wildcard DNS
            (``http://127.0.0.1:8156/``): the console links a workspace to
            ``<workspaces_url>-/workspaces/<name>/<port>/``. None means the host form
            ``https://<port>-<name>.<dns_zone>/`` with the agent's ``remote_development.dns_zone`` (issue 13).
    """

    api_address: str | None = None
    authentication_secret_file: Path | None = None
    ca_certificate_file: Path | None = None
    timeout: Duration = 3.0
    k8s_proxy_url: str | None = None
    k8s_proxy_ca_certificate_file: Path | None = None
    workspaces_url: str | None = None
    external_url: str | None = None
    version: str | None = None

    @field_validator("k8s_proxy_url", "workspaces_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value if value is None or value.endswith("/") else value + "/"

    @field_validator("external_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, sep, rest = value.partition("://")
        if not sep or not rest or scheme.lower() not in ("grpc", "grpcs", "ws", "wss", "http", "https"):
            raise ValueError(f"{value!r} is not a URL (grpc://, grpcs://, ws://, wss://, http:// or https://)")
        return value


class GitalyCF(_Section):
    """The Gitaly-compatible gRPC service serving agent configuration files to upstream kas (docs/interop.md).

    Attributes:
        listen: ``host:port`` to serve it on; None (the default) disables it, and ``agent_info`` then names
            an address nothing answers on (Tether kas never dials it).
        address: what kas dials, sent as ``gitaly_info.address``; None means ``tcp://<listen>``.
        token_file: the shared token kas signs each call with (Gitaly's v2 HMAC scheme); None means
            ``<data_dir>/gitaly_token``, generated on first use.
    """

    listen: str | None = None
    address: str | None = None
    token_file: Path | None = None


class SessionsCF(_Section):
    """Browser sessions (``/users/sign_in``) and their cookies.

    Attributes:
        lifetime: seconds a session lasts from sign-in (fixed: use does not extend it); more than 0.
        kas_cookie_domain: ``Domain`` attribute of the ``_gitlab_kas`` cookie, for kas on another host of the
            same site (``example.com`` when the hub is ``hub.example.com`` and kas ``kas.example.com``); None
            means a host-only cookie, which browsers send to kas only when it shares the hub's host name.
    """

    lifetime: Duration = 7 * 24 * 3600.0
    kas_cookie_domain: str | None = None

    @field_validator("lifetime")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be more than 0s")
        return value

    @field_validator("kas_cookie_domain")
    @classmethod
    def _domain(cls, value: str | None) -> str | None:
        if value is not None and not _COOKIE_DOMAIN.fullmatch(value):
            raise ValueError(f"{value!r} is not a domain name")
        return value


class SecurityCF(_Section):
    """Abuse limits (issue 9 item 4) and whom the hub believes about client addresses (issue 27 item 8).

    Attributes:
        failed_auth_per_source_per_minute: failed sign-ins and unknown tokens per client address and minute
            before that address gets 429 (counted in the database, across replicas); 0 turns it off. Behind a proxy
            every client shares its address unless the proxy is listed in ``trusted_proxies``.
        trusted_proxies: addresses or networks (``10.0.0.5``, ``10.0.0.0/8``, ``::1``) of the reverse proxies
            in front of the hub. Only a connection from one of them may name the client in
            ``X-Forwarded-For`` (the right-most address not itself a trusted proxy counts) and the scheme in
            ``X-Forwarded-Proto``; from anyone else both headers are ignored. Empty (the default): never
            believed, not even from 127.0.0.1, or any local process could escape the throttle.
    """

    failed_auth_per_source_per_minute: int = Field(default=60, ge=0)
    trusted_proxies: tuple[str, ...] = ()

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        networks = []
        for entry in value:
            try:
                networks.append(str(ipaddress.ip_network(entry.strip(), strict=False)))
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
        return tuple(networks)


class WorkspacesCF(_Section):
    """Instance-wide workspace limits (issue 27 item 3).

    Attributes:
        max_active_workspaces_per_user: workspaces one user may have whose desired state is not Terminated, over
            every agent, whatever the agents' own ``workspaces_per_user_quota``; -1 means no limit, 0 that
            nobody may create one. The CLI operator is not a user and creates none.
        default_devfile_image: the container image of the default devfile (a workspace created without a
            devfile); empty: GitLab's workspace image. ``tether up`` sets its node's local workspace image,
            since that node reaches no registry (issue 23 item 1).
    """

    max_active_workspaces_per_user: int = Field(default=50, ge=-1)
    default_devfile_image: str = Field(default="", max_length=512, pattern=r"^[A-Za-z0-9./:@_-]*$")

    @property
    def default_devfile(self) -> str:
        """The devfile of a workspace created without one (:func:`default_devfile` with this image)."""
        return default_devfile(self.default_devfile_image)


class AuditCF(_Section):
    """The audit trail kas sends (issue 25 item 1; ``docs/audit.md``).

    Attributes:
        retention_days: days an audit event is kept, counted from its time; older events are deleted by a
            sweep every replica runs each hour. 0 keeps them forever.
        recording_max_bytes: largest asciicast file stored for one recorded exec/attach session (issue 25
            item 2); kas' larger upload gets 413 and the session's audit event says its recording is incomplete.
    """

    retention_days: int = Field(default=90, ge=0, le=36500)
    recording_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)


class LoggingCF(_Section):
    """Process logging level."""

    level: Literal["debug", "info", "warn", "error"] = "info"


class ObservabilityCF(_Section):
    """``observability``: trace export (``tracing``, the same section as kas'; off by default)."""

    tracing: TracingCF = TracingCF()


class HubConfig(_Section):
    """The whole configuration file.

    Attributes:
        listen: ``host:port`` of the HTTP listener.
        external_url: base URL used in ``web_url`` fields and ``Link`` headers' fallback; None means
            ``http://<listen>``.
        data_dir: home of the default SQLite file and generated secret.
    """

    listen: str = DEFAULT_LISTEN
    external_url: str | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    database: DatabaseCF = DatabaseCF()
    gitlab: GitlabCF = GitlabCF()
    kas: KasCF = KasCF()
    gitaly: GitalyCF = GitalyCF()
    sessions: SessionsCF = SessionsCF()
    security: SecurityCF = SecurityCF()
    workspaces: WorkspacesCF = WorkspacesCF()
    audit: AuditCF = AuditCF()
    logging: LoggingCF = LoggingCF()
    observability: ObservabilityCF = ObservabilityCF()

    @property
    def database_url(self) -> str:
        """The configured URL, or the embedded SQLite file under ``data_dir``."""
        return self.database.url or f"sqlite+aiosqlite:///{self.data_dir.expanduser() / 'hub.db'}"

    @property
    def gitlab_secret_file(self) -> Path:
        """The internal API secret file (explicit or ``<data_dir>/gitlab_secret``)."""
        return self.gitlab.authentication_secret_file or self.data_dir.expanduser() / "gitlab_secret"

    @property
    def kas_secret_file(self) -> Path:
        """The kas api secret file (explicit or the gitlab secret file)."""
        return self.kas.authentication_secret_file or self.gitlab_secret_file

    @property
    def gitaly_token_file(self) -> Path:
        """The Gitaly token file (explicit or ``<data_dir>/gitaly_token``)."""
        return self.gitaly.token_file or self.data_dir.expanduser() / "gitaly_token"

    @property
    def gitaly_address(self) -> str:
        """``gitaly_info.address`` sent to kas: ``gitaly.address``, ``tcp://<gitaly.listen>``, or a placeholder."""
        if self.gitaly.address:
            return self.gitaly.address
        return f"tcp://{self.gitaly.listen}" if self.gitaly.listen else "tcp://gitaly.invalid:0"

    @property
    def base_url(self) -> str:
        """``external_url`` without a trailing slash."""
        return (self.external_url or f"http://{self.listen}").rstrip("/")

    @property
    def secure_cookies(self) -> bool:
        """Whether cookies get the ``Secure`` attribute: when ``external_url`` is ``https://``."""
        return self.base_url.lower().startswith("https://")

    def listen_host_port(self) -> tuple[str, int]:
        """Split ``listen``.

        Raises:
            ConfigError: not ``host:port`` with a numeric port.
        """
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ConfigError(f"listen: {self.listen!r} is not host:port")
        return host.strip("[]"), int(port)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def load_config(
    path: Path | None, environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> HubConfig:
    """Read the configuration.

    Args:
        path: YAML file, or None for defaults only.
        environ: environment to read ``TETHER_HUB_*`` overrides from (default ``os.environ``).
        overrides: dotted field -> value, applied last (command-line options); None values are skipped.

    Raises:
        ConfigError: unreadable file, bad YAML, unknown field, wrong type, or unsupported database URL.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded or {}
    env = os.environ if environ is None else environ
    for variable, dotted in ENV_OVERRIDES.items():
        if env.get(variable):
            _set_dotted(data, dotted, env[variable])
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    where = str(path) if path is not None else "configuration"
    try:
        config = HubConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {_problem(err)}" for err in exc.errors()
        )
        raise ConfigError(f"{where}: {problems}") from exc
    try:
        check_url(config.database_url)
    except DatabaseUrlError as exc:
        raise ConfigError(f"{where}: database.url: {exc}") from exc
    try:
        config.listen_host_port()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return config


def _problem(err: Mapping[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field"
    return str(err["msg"])
