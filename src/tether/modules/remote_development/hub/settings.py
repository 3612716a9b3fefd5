"""An agent's workspaces settings (reference §6.3), read from its configuration's ``remote_development``.

The hub keeps each distinct version in ``workspaces_agent_configs``; a workspace keeps the version it was
created with (upstream: paper_trail versions of ``workspaces_agent_configs``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from tether.modules.remote_development.protocol import DEFAULT_FULL_SYNC_SECONDS, DEFAULT_PARTIAL_SYNC_SECONDS

#: Upstream default egress: anywhere but the private ranges.
DEFAULT_EGRESS: tuple[dict[str, Any], ...] = (
    {"allow": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]},
)


@dataclass(frozen=True)
class WorkspacesSettings:
    """Settings with upstream's defaults (reference §6.3, §5.1).

    Attributes mirror the upstream names; intervals are in seconds; resources are
    ``{"limits": {"cpu": ..., "memory": ...}, "requests": {...}}``.
    """

    enabled: bool = False
    dns_zone: str = ""
    partial_sync_interval_s: int = DEFAULT_PARTIAL_SYNC_SECONDS
    full_sync_interval_s: int = DEFAULT_FULL_SYNC_SECONDS
    gitlab_workspaces_proxy_namespace: str = "gitlab-workspaces"
    network_policy_enabled: bool = True
    network_policy_egress: list[dict[str, Any]] = field(default_factory=lambda: [dict(e) for e in DEFAULT_EGRESS])
    default_resources_per_workspace_container: dict[str, dict[str, str]] = field(default_factory=dict)
    max_resources_per_workspace: dict[str, dict[str, str]] = field(default_factory=dict)
    workspaces_quota: int = -1
    workspaces_per_user_quota: int = -1
    use_kubernetes_user_namespaces: bool = False
    default_runtime_class: str = ""
    allow_privilege_escalation: bool = False
    image_pull_secrets: list[dict[str, str]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    max_active_hours_before_stop: int = 36
    max_stopped_hours_before_termination: int = 744
    shared_namespace: str = ""

    @cached_property
    def max_resources_sha256(self) -> str:
        """Hex SHA-256 of ``max_resources_per_workspace`` (sorted JSON): the objects' change detector (§4.2)."""
        text = json.dumps(self.max_resources_per_workspace, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (stored in the database; compared to find a new version)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkspacesSettings:
        """Inverse of :meth:`to_json`; unknown keys are ignored (older rows)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def _seconds(value: object, default: int) -> int:
    # protobuf JSON renders a Duration as "10s" / "3600.5s".
    if isinstance(value, str) and value.endswith("s"):
        return max(1, round(float(value[:-1])))
    return default


def _resources(value: object) -> dict[str, dict[str, str]]:
    if not isinstance(value, Mapping):
        return {}
    return {kind: dict(value[kind]) for kind in ("limits", "requests") if isinstance(value.get(kind), Mapping)}


def from_configuration(section: Mapping[str, Any] | None) -> WorkspacesSettings:
    """Settings from the ``remote_development`` section of an agent configuration document.

    The section is protobuf JSON with snake_case names; absent fields take the defaults.

    Raises:
        ValueError: rules the configuration parser cannot express (reference §6.3): hours out of 1..8760,
            active + stopped hours above 8760, partial interval not below the full one.
    """
    raw = dict(section or {})
    proxy = raw.get("gitlab_workspaces_proxy") or {}
    policy = raw.get("network_policy") or {}
    defaults = WorkspacesSettings()
    egress = policy.get("egress")
    settings = WorkspacesSettings(
        enabled=bool(raw.get("enabled", False)),
        dns_zone=str(raw.get("dns_zone", "")),
        partial_sync_interval_s=_seconds(raw.get("partial_sync_interval"), DEFAULT_PARTIAL_SYNC_SECONDS),
        full_sync_interval_s=_seconds(raw.get("full_sync_interval"), DEFAULT_FULL_SYNC_SECONDS),
        gitlab_workspaces_proxy_namespace=str(proxy.get("namespace") or defaults.gitlab_workspaces_proxy_namespace),
        network_policy_enabled=bool(policy.get("enabled", True)),
        network_policy_egress=(
            [{"allow": e.get("allow", ""), "except": list(e.get("except", []))} for e in egress]
            if egress
            else defaults.network_policy_egress
        ),
        default_resources_per_workspace_container=_resources(raw.get("default_resources_per_workspace_container")),
        max_resources_per_workspace=_resources(raw.get("max_resources_per_workspace")),
        workspaces_quota=int(raw.get("workspaces_quota", -1)),
        workspaces_per_user_quota=int(raw.get("workspaces_per_user_quota", -1)),
        use_kubernetes_user_namespaces=bool(raw.get("use_kubernetes_user_namespaces", False)),
        default_runtime_class=str(raw.get("default_runtime_class", "")),
        allow_privilege_escalation=bool(raw.get("allow_privilege_escalation", False)),
        image_pull_secrets=[
            {"name": s.get("name", ""), "namespace": s.get("namespace", "")} for s in raw.get("image_pull_secrets", [])
        ],
        annotations=dict(raw.get("annotations", {})),
        labels=dict(raw.get("labels", {})),
        max_active_hours_before_stop=int(raw.get("max_active_hours_before_stop", 36)),
        max_stopped_hours_before_termination=int(raw.get("max_stopped_hours_before_termination", 744)),
        shared_namespace=str(raw.get("shared_namespace", "")),
    )
    _check(settings)
    return settings


def _check(s: WorkspacesSettings) -> None:
    where = "remote_development"
    for name in ("max_active_hours_before_stop", "max_stopped_hours_before_termination"):
        value = getattr(s, name)
        if not 1 <= value <= 8760:
            raise ValueError(f"{where}.{name}: must be between 1 and 8760 hours, not {value}")
    if s.max_active_hours_before_stop + s.max_stopped_hours_before_termination > 8760:
        raise ValueError(
            f"{where}: max_active_hours_before_stop + max_stopped_hours_before_termination must not exceed 8760"
        )
    if s.partial_sync_interval_s >= s.full_sync_interval_s:
        raise ValueError(f"{where}.partial_sync_interval: must be shorter than full_sync_interval")
    if s.enabled and not s.dns_zone:
        raise ValueError(f"{where}.dns_zone: is required when workspaces are enabled")
    if s.allow_privilege_escalation and not (s.default_runtime_class or s.use_kubernetes_user_namespaces):
        raise ValueError(
            f"{where}.allow_privilege_escalation: needs default_runtime_class or use_kubernetes_user_namespaces"
        )
    names = [secret["name"] for secret in s.image_pull_secrets]
    if len(names) != len(set(names)):
        raise ValueError(f"{where}.image_pull_secrets: names must be unique")
