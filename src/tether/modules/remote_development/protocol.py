"""The reconcile messages between agentk and the hub, and the words both halves share (reference §1.3-§1.4).

agentk's half (``agent/``) builds a :class:`ReconcileRequest` and reads a :class:`ReconcileResponse`; the hub's
half (``hub/``) checks the request against upstream's schema (:mod:`~tether.modules.remote_development.hub.params`,
which accepts any agentk's body, upstream's too) and builds the response. Field names and order are the JSON
ones, so ``msgspec.json.encode`` writes the bytes upstream's agentk and GitLab exchange; an optional request
field left :data:`msgspec.UNSET` is not written at all (agentk sends only what it knows).
"""

from __future__ import annotations

from typing import Any

import msgspec

#: ``update_type`` values: a full sync reports and receives every workspace, a partial one only the changes.
UPDATE_FULL = "full"
UPDATE_PARTIAL = "partial"
#: Default reconcile intervals (upstream's ``partial_sync_interval``/``full_sync_interval``), in seconds.
DEFAULT_PARTIAL_SYNC_SECONDS = 10
DEFAULT_FULL_SYNC_SECONDS = 3600
#: Label and annotation of the cli-utils inventory in each ``config_to_apply`` (reference §4.2); agentk's
#: applier prunes by them.
INVENTORY_ID_LABEL = "cli-utils.sigs.k8s.io/inventory-id"
OWNING_INVENTORY = "config.k8s.io/owning-inventory"
#: Pod problems agentk reports that mean the Deployment cannot progress on its own.
FAILING_POD_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "Unschedulable",
        "Error",
        "OOMKilled",
    }
)


class PodFailure(msgspec.Struct):
    """Tether's ``pod_failure``: a problem agentk saw on the workspace's pods (not in upstream's schema).

    Attributes:
        reason: the pod's word (``ImagePullBackOff``, ``Unschedulable``...).
        message: the cluster's explanation (may be empty).
        lasting: False while the cause may still resolve on its own (unschedulable for less than the grace).
    """

    reason: str
    message: str
    lasting: bool


class ErrorDetails(msgspec.Struct):
    """``error_details`` of a workspace whose apply failed (reference §1.3).

    Attributes:
        error_type: ``applier`` or ``kubernetes``.
        error_message: the error's text.
    """

    error_type: str
    error_message: str


class WorkspaceAgentInfo(msgspec.Struct):
    """One ``workspace_agent_info``: what agentk knows of one workspace (reference §1.3).

    Attributes:
        name, namespace: the workspace.
        latest_k8s_deployment_info: the workspace's Deployment as the API server returned it.
        pod_failure: see :class:`PodFailure`.
        termination_progress: ``Terminating`` or ``Terminated`` while agentk deletes it.
        error_details: see :class:`ErrorDetails`.
    """

    name: str
    namespace: str
    latest_k8s_deployment_info: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    pod_failure: PodFailure | msgspec.UnsetType = msgspec.UNSET
    termination_progress: str | msgspec.UnsetType = msgspec.UNSET
    error_details: ErrorDetails | msgspec.UnsetType = msgspec.UNSET


class ReconcileRequest(msgspec.Struct):
    """The body agentk posts to ``.../modules/remote_development/reconcile`` (reference §1.3).

    Attributes:
        update_type: :data:`UPDATE_FULL` or :data:`UPDATE_PARTIAL`.
        workspace_agent_infos: one per workspace reported, in agentk's order.
    """

    update_type: str
    workspace_agent_infos: list[WorkspaceAgentInfo]


class ImagePullSecret(msgspec.Struct):
    """One of the agent's ``image_pull_secrets`` (reference §6.3): a Secret agentk copies into the namespace."""

    name: str = ""
    namespace: str = ""


class WorkspaceRailInfo(msgspec.Struct):
    """One ``workspace_rails_info``: what the hub wants of one workspace (reference §1.4).

    Every field has a default so that agentk reads an answer of an older or newer GitLab (unknown fields are
    ignored by msgspec).

    Attributes:
        name, namespace: the workspace.
        desired_state, actual_state: state names (:class:`~tether.modules.remote_development.states.State`);
            plain strings here, so that a state a newer GitLab adds does not make the whole answer unreadable.
        deployment_resource_version: the Deployment version the hub acknowledges, or None (report it again).
        config_to_apply: multi-document YAML to apply, or "" (nothing to apply).
        image_pull_secrets: Secrets to copy into the workspace's namespace.
    """

    name: str = ""
    namespace: str = ""
    desired_state: str = ""
    actual_state: str = ""
    deployment_resource_version: str | None = None
    config_to_apply: str | None = ""
    image_pull_secrets: list[ImagePullSecret] = msgspec.field(default_factory=list)


class ReconcileSettings(msgspec.Struct):
    """The intervals agentk must use from now on (reference §1.4), in seconds."""

    full_reconciliation_interval_seconds: int = DEFAULT_FULL_SYNC_SECONDS
    partial_reconciliation_interval_seconds: int = DEFAULT_PARTIAL_SYNC_SECONDS


class ReconcileResponse(msgspec.Struct):
    """The hub's 201 answer to a reconcile request (reference §1.4).

    Attributes:
        workspace_rails_infos: the workspaces agentk must act on.
        settings: see :class:`ReconcileSettings`.
    """

    workspace_rails_infos: list[WorkspaceRailInfo] = msgspec.field(default_factory=list)
    settings: ReconcileSettings = msgspec.field(default_factory=ReconcileSettings)
