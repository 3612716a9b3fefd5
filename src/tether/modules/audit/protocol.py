"""The audit event kas sends to the hub (issue 25 item 1; the contract of the three audit branches).

JSON on the wire with these snake_case field names; a field at its default is not written (``omit_defaults``).
kas posts ``{"events": [AuditEvent, ...]}`` (at most :data:`MAX_BATCH_EVENTS` events, :data:`MAX_BATCH_BYTES`
bytes) to :data:`INGEST_PATH`; the hub stores each ``id`` once (a repeated id is counted as a duplicate), so a
batch retried after a lost reply stores nothing twice.
"""

from __future__ import annotations

import msgspec

#: The hub's internal ingestion route (JWT as every internal kas -> hub call).
INGEST_PATH = "/api/v4/internal/kubernetes/audit_events"
#: Limits of one ingestion batch (the hub answers 400 beyond them).
MAX_BATCH_EVENTS = 1000
MAX_BATCH_BYTES = 4 * 1024 * 1024

#: ``AuditEvent.kind`` values.
KIND_KUBERNETES_API = "kubernetes_api"
KIND_GRAPH = "graph"
KIND_WORKSPACE = "workspace"
KIND_GRPC = "grpc"

#: ``ClusterIdentity.kind`` values: agentk's own service account, or impersonation of the user.
CLUSTER_AGENT = "agent"
CLUSTER_IMPERSONATE = "impersonate"

#: ``AuditEvent.recording`` values ("" means no recording).
RECORDING_COMPLETE = "complete"
RECORDING_INCOMPLETE = "incomplete"


class ClusterIdentity(msgspec.Struct, omit_defaults=True):
    """The identity a relayed request used at the cluster.

    ``kind`` is "agent" (agentk's own service account) or "impersonate" (``user`` and ``groups`` impersonated,
    the ``user_access`` rules of the agent configuration).
    """

    kind: str  # "agent" (agentk's own service account) | "impersonate"
    user: str = ""  # impersonated user name
    groups: list[str] = []  # impersonated groups


class AuditEvent(msgspec.Struct, omit_defaults=True):
    """One request kas relayed (or refused) towards an agent.

    ``id`` (uuid4 hex made by kas when the request starts) is the hub's dedup key; ``time`` is the request start
    in unix seconds, ``duration_ms`` its length in milliseconds; ``bytes_in`` counts client -> cluster bytes
    (request body, upgraded stream bytes), ``bytes_out`` cluster -> client. ``verb`` is the Kubernetes verb
    (get/list/watch/create/update/patch/delete/exec/attach/portforward/proxy) or the HTTP method for a
    non-resource path, the gRPC method for "grpc", "session" for graph / workspace websockets. ``status`` is the
    HTTP status sent to the client (gRPC: the status code number; refused: 401/403/429...). ``token_id`` is the
    hub's token id, never the token.
    """

    id: str  # uuid4 hex made by kas when the request starts: the hub's dedup key
    time: float  # unix seconds, request start
    kind: str  # "kubernetes_api" | "graph" | "workspace" | "grpc"
    agent_id: int
    kas_instance: str  # the kas instance id (its private API address or name)
    verb: str
    status: int
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


class AuditBatch(msgspec.Struct):
    """The body of one ingestion POST: ``{"events": [...]}``."""

    events: list[AuditEvent]


class AuditBatchReply(msgspec.Struct):
    """The hub's answer to one ingestion POST: events stored now, and events whose id was already stored."""

    accepted: int
    duplicates: int
