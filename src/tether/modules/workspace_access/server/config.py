"""The ``workspaces`` section of kas' configuration (Tether addition, issue 13): users reach their workspaces."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tether.modserver.config import ListenCF, Section
from tether.tool.durations import Duration

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class WorkspacesListenCF(ListenCF):
    """The workspaces' HTTP listener (issue 13); TLS when both certificate and key are set."""

    address: str = "0.0.0.0:8156"
    #: After SIGTERM, how long the listener still accepts requests.
    listen_grace_period: Duration = 5.0
    #: After SIGTERM, how long in-flight requests (downloads, an editor's WebSockets) may continue before being cut.
    shutdown_grace_period: Duration = 60.0


class WorkspacesCF(Section):
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
