"""The ``header`` frame of one proxied Kubernetes API request (kas.md §5.3 step 3).

kas' own credentials and parameters stay in kas: the ``Authorization`` and ``Cookie`` headers, the agent id and
CSRF header or query parameter, ``Expect`` (kas answers ``100-continue`` itself). The impersonation kas imposes
travels in ``extra`` as ``HeaderExtra.imp_config``.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from tether.modules.kubernetes_api.server.auth import AGENT_ID_HEADER, AGENT_ID_QUERY, CSRF_HEADER, CSRF_QUERY
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.http_grpc.headers import HeaderMap, canonical_key, clean_headers, to_values, via_value
from tether.tool.http_grpc.proxy_call import content_length_of
from tether.tool.tracing import TRACE_KEYS

__all__ = ["request_header"]

#: Request headers that carry kas' own credentials or were already handled by kas (kas.md §5.3 step 3).
_KAS_HEADERS = ("Authorization", "Cookie", AGENT_ID_HEADER, CSRF_HEADER, "Expect")
_KAS_QUERY = frozenset({AGENT_ID_QUERY, CSRF_QUERY})
_HttpRequest = grpctool_pb2.HttpRequest


def request_header(
    request: web.BaseRequest,
    url_path: str,
    impersonation: rpc_pb2.ImpersonationConfig | None,
    trace: Sequence[tuple[str, str]] = (),
) -> _HttpRequest:
    """The ``header`` frame for ``request``.

    Args:
        request: the client's request.
        url_path: its path with the proxy prefix stripped, e.g. ``/api/v1/pods``.
        impersonation: the identity to impose, or None to use the agent's own.
        trace: kas' span as W3C trace context (``traceparent``...) replacing the client's, or empty (tracing off:
            the client's headers pass untouched).
    """
    headers = clean_headers(request.headers.items(), drop=_KAS_HEADERS if not trace else (*_KAS_HEADERS, *TRACE_KEYS))
    for key, value in trace:
        headers[canonical_key(key)] = [value]
    headers.setdefault("Via", []).append(via_value("gRPC/1.0", "gitlab-kas"))
    query: HeaderMap = {}
    for key, value in request.rel_url.query.items():
        if key not in _KAS_QUERY:
            query.setdefault(key, []).append(value)
    header = _HttpRequest.Header(
        request=prototool_pb2.HttpRequest(
            method=request.method, header=to_values(headers), url_path=url_path, query=to_values(query)
        ),
        content_length=content_length_of(request),
    )
    if impersonation is not None:
        header.extra.Pack(rpc_pb2.HeaderExtra(imp_config=impersonation))
    return _HttpRequest(header=header)
