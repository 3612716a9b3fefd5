"""The audit seam of the module API (issue 25 item 1): ``ServerApi.audit``, one record per relayed request.

A hook in a relay (the Kubernetes API proxy, the workspaces listener, the routed gRPC APIs) calls
:meth:`AuditSink.begin` when a request arrives, fills in what it learns (identity, target, the byte counter of
its stream) and calls :meth:`AuditRecord.finish` once with the status sent. Nothing here blocks, raises or
imports the wire format: the ``audit`` module's sink (``tether.modules.audit.server``) turns finished records
into ``AuditEvent`` messages and ships them; this base sink, used when auditing is off, drops them.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

if TYPE_CHECKING:
    import msgspec

__all__ = ["REQUEST_KEY", "STATUS_CLIENT_GONE", "AuditRecord", "AuditSink", "ByteCounter"]


#: Status recorded when the client went away before an answer was sent (nginx' "client closed request").
STATUS_CLIENT_GONE = 499


class ByteCounter(Protocol):
    """A relayed stream that counts its bytes: client -> cluster (``bytes_in``), cluster -> client (``bytes_out``).

    ``status_sent`` is the status of the response head sent to the client, 0 before one was sent.
    """

    bytes_in: int
    bytes_out: int
    status_sent: int


class AuditRecord:
    """The bookkeeping of one relayed request; the fields are ``AuditEvent``'s (``modules/audit/protocol.py``).

    ``id`` (uuid4 hex) and ``time`` (unix seconds) are set when the request starts; ``counter``, when set, supplies
    the byte counts at :meth:`finish`. ``impersonated`` None means agentk's own identity at the cluster.
    """

    __slots__ = (
        "_sink",
        "_started",
        "agent_id",
        "api_group",
        "api_version",
        "bytes_in",
        "bytes_out",
        "counter",
        "duration_ms",
        "head_status",
        "id",
        "impersonated",
        "kind",
        "name",
        "namespace",
        "path",
        "recording",
        "request_id",
        "resource",
        "source_address",
        "status",
        "subresource",
        "time",
        "token_id",
        "token_kind",
        "user_id",
        "username",
        "verb",
    )

    def __init__(self, sink: AuditSink, kind: str, verb: str, path: str, request_id: str, source_address: str) -> None:
        self._sink: AuditSink | None = sink
        self._started = time.monotonic()
        self.id = uuid.uuid4().hex
        self.time = time.time()
        self.kind = kind
        self.verb = verb
        self.path = path
        self.request_id = request_id
        self.source_address = source_address
        self.agent_id = 0
        self.status = 0
        self.duration_ms = 0.0
        self.bytes_in = 0
        self.bytes_out = 0
        self.counter: ByteCounter | None = None
        self.user_id = 0
        self.username = ""
        self.token_id = 0
        self.token_kind = ""
        self.impersonated: tuple[str, tuple[str, ...]] | None = None
        self.api_group = ""
        self.api_version = ""
        self.resource = ""
        self.subresource = ""
        self.namespace = ""
        self.name = ""
        self.recording = ""
        #: The status of a head a handler sent itself (a WebSocket's 101), for a session that then ends without an
        #: answer to return (the client left while it wound down); 0 while none was sent.
        self.head_status = 0

    def discard(self) -> None:
        """Drop the record: the request turned out not to be one kas relays (e.g. a CORS preflight)."""
        self._sink = None

    def finish(self, status: int | None) -> None:
        """Close the record with the HTTP status sent (gRPC: the status code number) and hand it to the sink.

        ``None``: the handler ended without an answer (the client went away, e.g. at the end of an upgraded
        stream): the status of the head the handler or the counter sent, else :data:`STATUS_CLIENT_GONE`. A
        second call does nothing (a hook's ``finally`` may follow an earlier finish).
        """
        sink, self._sink = self._sink, None
        if sink is None:
            return
        if status is None:
            sent = self.counter.status_sent if self.counter is not None else 0
            status = self.head_status or sent or STATUS_CLIENT_GONE
        self.status = status
        self.duration_ms = (time.monotonic() - self._started) * 1000.0
        if self.counter is not None:
            self.bytes_in, self.bytes_out = self.counter.bytes_in, self.counter.bytes_out
            self.counter = None
        sink.finished(self)


class AuditSink:
    """Where relays send their records; this base drops them (auditing off, or a kas built without the module)."""

    #: Whether records are kept (hooks may skip optional work when False).
    enabled = False

    def begin(self, kind: str, verb: str, path: str, request_id: str, source_address: str) -> AuditRecord:
        """A new record for a request that just arrived.

        Args:
            kind: ``AuditEvent.kind`` ("kubernetes_api", "graph", "workspace", "grpc").
            verb: the verb as far as known now (the HTTP method, or the gRPC method); hooks may refine it.
            path: the request path without the query string (the gRPC method for "grpc").
            request_id: kas' request id (the one in its logs and sent to agentk).
            source_address: the client's address.
        """
        return AuditRecord(self, kind, verb, path, request_id, source_address)

    def finished(self, record: AuditRecord) -> None:
        """Take a finished record; never blocks, never raises."""

    def record(self, event: msgspec.Struct) -> None:
        """Take a ready-made ``tether.modules.audit.protocol.AuditEvent`` (e.g. one with ``recording`` set).

        Never blocks, never raises. (Typed as any msgspec Struct: this layer does not import the modules'.)
        """


#: Where an HTTP relay keeps a request's record on the aiohttp request (``request[REQUEST_KEY]``), so code deeper
#: in the relay (e.g. a session recorder setting ``recording``) can reach it.
REQUEST_KEY: web.RequestKey[AuditRecord] = web.RequestKey("tether_audit_record", AuditRecord)
