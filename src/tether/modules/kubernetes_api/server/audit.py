"""What the Kubernetes API proxy writes into a request's audit record (issue 25 item 1; ``ServerApi.audit``)."""

from __future__ import annotations

from collections.abc import Mapping

from tether.modserver.audit import AuditRecord
from tether.modserver.gitlab_client import ProxyUserAuthorization
from tether.modules.kubernetes_api.server.auth import PAT_ACCESS, SESSION_ACCESS
from tether.modules.kubernetes_api.server.request_info import request_info
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2

__all__ = ["audit_credentials", "audit_identity", "audit_session", "audit_target"]

#: ``AuditEvent.token_kind`` of each credential form (kas.md §4.5 access types).
_TOKEN_KINDS = {PAT_ACCESS: "personal_access", SESSION_ACCESS: "session"}


def audit_target(record: AuditRecord, method: str, url_path: str, query: Mapping[str, str]) -> None:
    """Verb, API group/version, resource, subresource, namespace and name as the API server reads them."""
    info = request_info(method, url_path, query)
    record.path = url_path
    record.verb = info.verb
    record.api_group, record.api_version = info.api_group, info.api_version
    record.resource, record.subresource = info.resource, info.subresource
    record.namespace, record.name = info.namespace, info.name


def audit_session(record: AuditRecord, kind: str) -> None:
    """A path kas serves itself (the Graph API's WebSocket): ``kind`` (e.g. "graph") and the verb "session"."""
    record.kind = kind
    record.verb = "session"
    record.api_group = record.api_version = record.resource = record.subresource = ""
    record.namespace = record.name = ""


def audit_credentials(record: AuditRecord, agent_id: int, access_type: str) -> None:
    """What the credentials say before the hub answered: the agent and the kind of token."""
    record.agent_id = agent_id
    record.token_kind = _TOKEN_KINDS.get(access_type, "")


def audit_identity(
    record: AuditRecord, auth: ProxyUserAuthorization, impersonation: rpc_pb2.ImpersonationConfig | None
) -> None:
    """The user the hub authenticated and the identity the request uses at the cluster."""
    record.user_id, record.username, record.token_id = auth.user_id, auth.username, auth.credential_id
    if impersonation is not None:
        record.impersonated = (impersonation.username, tuple(impersonation.groups))
