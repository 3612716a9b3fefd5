"""agentk half of the Kubernetes API proxy: ``KubernetesApi.MakeRequest`` on the internal server (kas.md §5.4).

Each call carries one HTTP request (``header``, ``data``*, ``trailer``, then ``upgradeData``* after a
``101``; the order is checked against the ``HttpRequest`` automaton). It is sent to the API server with
the agent's own credentials (token or client certificate from the kubeconfig or the pod's ServiceAccount),
after removing hop-by-hop headers and the caller's ``Authorization``. When kas imposes an identity
(``HeaderExtra.imp_config``), the ``Impersonate-*`` headers are added, and a request that already carries
such headers is refused (``PERMISSION_DENIED``, nested impersonation). The response streams back as
``header``, ``data`` chunks of at most 32 KiB as they arrive, ``trailer`` and, after a ``101``,
``upgradeData`` both ways on the raw connection (``tool/http_grpc/outbound.py``). Failures to talk to the API
server end the call with ``UNAVAILABLE "gRPC -> HTTP: ..."``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import structlog
import yarl

from tether.kube.kubeconfig import KubeCredentials
from tether.modules.kubernetes_api.rpc.impersonation import (
    NESTED_IMPERSONATION,
    carries_impersonation,
    impersonation_headers,
)
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2
from tether.tool.http_grpc.headers import clean_headers, from_values, is_upgrade, via_value
from tether.tool.http_grpc.outbound import (
    OUTBOUND_ERRORS,
    AgentRequestError,
    MakeRequestServicer,
    OutboundHttp,
    RequestFrames,
    Send,
)

__all__ = ["SERVICE", "AgentRequestError", "KubernetesApiAgent"]

_log = structlog.get_logger(__name__)

SERVICE = "gitlab.agent.kubernetes_api.rpc.KubernetesApi"
#: TCP connect + TLS handshake limit towards the API server, seconds (kas.md §5.4).
CONNECT_TIMEOUT_S = 30.0
#: A rotated ServiceAccount token file is re-read after this many seconds.
TOKEN_REREAD_S = 60.0
#: The caller's credentials never reach the API server; the agent's own are used.
_CALLER_AUTH = ("Authorization",)
_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse


class _Token:
    """The agent's bearer token: static, or re-read from a file the kubelet rotates."""

    def __init__(self, value: str | None, path: Path | None) -> None:
        self._value = value
        self._path = path
        self._read_at = -TOKEN_REREAD_S

    def get(self) -> str | None:
        if self._path is not None and time.monotonic() - self._read_at >= TOKEN_REREAD_S:
            try:
                self._value = self._path.read_text().strip()
                self._read_at = time.monotonic()
            except OSError as exc:
                if self._value is None:
                    raise AgentRequestError(
                        grpc.StatusCode.UNAVAILABLE, f"gRPC -> HTTP: cannot read token file {self._path}: {exc}"
                    ) from exc
        return self._value


def _imp_config(header: _Request.Header) -> rpc_pb2.ImpersonationConfig | None:
    if not header.HasField("extra"):
        return None
    extra = rpc_pb2.HeaderExtra()
    if not header.extra.Unpack(extra):
        raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected header extra {header.extra.type_url!r}")
    return extra.imp_config if extra.HasField("imp_config") else None


class KubernetesApiAgent(MakeRequestServicer):
    """Serves ``KubernetesApi.MakeRequest`` with the agent's Kubernetes credentials.

    Use inside a running event loop; :meth:`close` when done.

    Args:
        credentials: the API server URL, TLS material and token of the agent.
        connect_timeout_s: limit for connecting to the API server, seconds.
    """

    def __init__(self, credentials: KubeCredentials, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._credentials = credentials
        self._base = yarl.URL(credentials.server)
        self._token = _Token(credentials.token, credentials.token_file)
        super().__init__(OutboundHttp(credentials.ssl_context, connect_timeout_s))

    async def serve(self, requests: AsyncIterator[_Request], send: Send) -> None:
        """Make the HTTP request carried by ``requests`` and ``send`` the response frames.

        Raises:
            StatusError: INVALID_ARGUMENT (broken request stream), PERMISSION_DENIED (nested
                impersonation), UNAVAILABLE (``gRPC -> HTTP: ...``: the API server could not be reached or
                failed mid-response).
        """
        frames = RequestFrames(requests)
        header = await frames.header()
        imp_config = _imp_config(header)
        incoming = from_values(header.request.header)
        if imp_config is not None and (name := carries_impersonation(k for k, _ in incoming)):
            raise AgentRequestError(
                grpc.StatusCode.PERMISSION_DENIED, f"{NESTED_IMPERSONATION}: the request carries {name}"
            )
        upgrade = is_upgrade(incoming)
        headers = [(k, v) for k, values in clean_headers(incoming, drop=_CALLER_AUTH).items() for v in values]
        headers.append(("Via", via_value("gRPC/1.0", "gitlab-agent")))
        if imp_config is not None:
            headers += impersonation_headers(imp_config)
        token = self._token.get()
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        url = self._base.with_path(self._base.path.rstrip("/") + header.request.url_path).with_query(
            from_values(header.request.query)
        )
        try:
            await self._http.forward(frames, header, url, headers, upgrade, send)
        except OUTBOUND_ERRORS as exc:
            _log.info("k8s_proxy_request_failed", method=header.request.method, path=url.path, error=repr(exc))
            raise AgentRequestError(grpc.StatusCode.UNAVAILABLE, f"gRPC -> HTTP: {exc!r}") from exc
