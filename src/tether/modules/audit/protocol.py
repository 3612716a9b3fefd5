"""The audit event kas sends the hub (issue 25 item 1; /work/helpers/AUDIT_CONTRACT.md).

msgspec Structs, JSON on the wire with these snake_case field names; the hub's internal API takes them as
``POST /api/v4/internal/kubernetes/audit_events`` with body ``{"events": [AuditEvent, ...]}``.
"""

from __future__ import annotations

import msgspec


class ClusterIdentity(msgspec.Struct, omit_defaults=True):
    """The identity kas used at the cluster: agentk's own service account or an impersonated user."""

    kind: str  # "agent" (agentk's own service account) | "impersonate"
    user: str = ""  # impersonated user name
    groups: list[str] = []  # impersonated groups


class AuditEvent(msgspec.Struct, omit_defaults=True):
    """One request kas relayed to an agent (or refused), as kas ships it to the hub."""

    id: str  # uuid4 hex made by kas when the request starts: the hub's dedup key
    time: float  # unix seconds, request start
    kind: str  # "kubernetes_api" | "graph" | "workspace" | "grpc"
    agent_id: int
    kas_instance: str  # the kas instance id (its private API address or name)
    verb: str  # Kubernetes verb (get/list/watch/create/update/patch/delete/exec/attach/
    # portforward/proxy) or HTTP method for non-resource paths, gRPC method for "grpc",
    # "session" for graph / workspace websockets
    status: int  # HTTP status sent to the client (gRPC: the status code number; refused: 401/403/...)
    duration_ms: float
    bytes_in: int = 0  # client -> cluster (request body, upgraded stream bytes)
    bytes_out: int = 0  # cluster -> client
    user_id: int = 0  # 0: no user (agent-only, refused before authentication)
    username: str = ""
    token_id: int = 0  # the hub's token id; never the token
    token_kind: str = ""  # "personal_access" | "session" | "ci_job" | "agent" | "oauth" | ""
    cluster_identity: ClusterIdentity | None = None
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""  # request path without the query string
    request_id: str = ""
    source_address: str = ""
    recording: str = ""  # "" none | "complete" | "incomplete" (h-record sets it)
