"""The ``agent.kubernetes_api`` section of kas' configuration (kas.md §5, §7): the Kubernetes API proxy."""

from __future__ import annotations

from pydantic import Field, field_validator

from tether.modserver.config import ListenCF, Section
from tether.tool.durations import Duration


class KubernetesApiListenCF(ListenCF):
    """The Kubernetes API proxy's HTTP listener (kas.md §5.1); TLS when both certificate and key are set."""

    address: str = "0.0.0.0:8154"
    #: After SIGTERM, how long the listener still accepts requests (upstream ``listen_grace_period``).
    listen_grace_period: Duration = 5.0
    #: After SIGTERM, how long in-flight requests (watches, exec sessions) may continue before being cut.
    shutdown_grace_period: Duration = 3600.0


class KubernetesApiCF(Section):
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
    #: Tether addition (issue 25 item 2): most bytes kept of one recorded exec/attach session (agents with
    #: ``audit: {record_sessions: true}``); beyond them the recording stops and is marked incomplete.
    session_recording_max_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    #: Tether addition: most bytes all recorded sessions of this kas hold at once (kept bytes of running
    #: sessions, files not yet stored); a recording that would go beyond it stops and is marked incomplete. It
    #: bounds what a user who holds many sessions open makes kas buffer (docs/limits.md).
    session_recording_max_total_bytes: int = Field(default=128 * 1024 * 1024, ge=0)
    #: Longest wait for the hub to store a finished session's recording; then it is given up (incomplete).
    session_recording_store_timeout: Duration = Field(default=10.0, gt=0)

    @field_validator("url_path_prefix")
    @classmethod
    def _normalize_prefix(cls, value: str) -> str:
        # kas.md §5.1: always normalised to end with "/".
        if not value.startswith("/"):
            raise ValueError(f"url_path_prefix {value!r} must start with '/'")
        return value if value.endswith("/") else value + "/"
