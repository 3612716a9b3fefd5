"""The OpenTelemetry SDK behind :mod:`tether.tool.tracing`; imported only when tracing is on (issue 25 item 3).

Spans are batched in memory and POSTed to ``<endpoint>/v1/traces`` (OTLP/HTTP, protobuf) by the SDK's
exporter thread, so a slow or absent collector never holds up a request: a full batch queue drops spans. The
provider is this process' own, not the global one, so nothing else in the process starts tracing by accident.
Parents come from explicit carriers (gRPC metadata, HTTP headers), not from an ambient context, except inside
agentk's ``MakeRequest`` handler where :meth:`Tracer.attach` makes the tunnelled call's context current for the
outbound HTTP request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tether import __version__

__all__ = ["Span", "Tracer"]

_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {
    "server": trace.SpanKind.SERVER,
    "client": trace.SpanKind.CLIENT,
    "internal": trace.SpanKind.INTERNAL,
}
#: Attribute values the SDK accepts.
Attributes = Mapping[str, str | int | float | bool]


def _trace_pairs(carrier: Iterable[tuple[str, Any]]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for key, value in carrier:
        name = key.lower()
        if name in ("traceparent", "tracestate") and name not in pairs:
            pairs[name] = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return pairs


class Span:
    """One span of this process; :meth:`end` it exactly once."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def carrier(self) -> tuple[tuple[str, str], ...]:
        """This span as W3C trace context pairs (``traceparent`` and maybe ``tracestate``) for the next hop."""
        out: dict[str, str] = {}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(self._span))
        return tuple(out.items())

    def set(self, key: str, value: str | int | float | bool) -> None:
        """Add one attribute, e.g. ``http.response.status_code``."""
        self._span.set_attribute(key, value)

    def fail(self, message: str) -> None:
        """Mark the span failed with ``message`` (OpenTelemetry status ERROR)."""
        self._span.set_status(trace.Status(trace.StatusCode.ERROR, message[:500]))

    def http_status(self, code: int, server: bool) -> None:
        """Record an HTTP answer; 5xx fails a server span, 4xx and 5xx a client span (HTTP semantic conventions)."""
        self._span.set_attribute("http.response.status_code", code)
        if code >= 500 or (not server and code >= 400):
            self.fail(f"HTTP {code}")

    def grpc_status(self, code: int, message: str = "") -> None:
        """Record a gRPC status code (0 is OK; anything else fails the span)."""
        self._span.set_attribute("rpc.grpc.status_code", code)
        if code != 0:
            self.fail(message or f"gRPC status {code}")

    def end(self) -> None:
        """Finish the span; it is exported with the next batch."""
        self._span.end()


class Tracer:
    """This process' tracer: spans batched and exported over OTLP/HTTP.

    Args:
        service: ``service.name``.
        endpoint: base URL of the OTLP/HTTP receiver (``/v1/traces`` is appended).
        ratio: share of new traces sampled (parent-based: a sampled parent is always followed).
        instance: ``service.instance.id``, or None.
    """

    def __init__(self, service: str, endpoint: str, ratio: float, instance: str | None) -> None:
        attributes: dict[str, str] = {"service.name": service, "service.version": __version__}
        if instance:
            attributes["service.instance.id"] = instance
        self._provider = TracerProvider(
            resource=Resource.create(attributes), sampler=ParentBased(TraceIdRatioBased(ratio))
        )
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces", timeout=10)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("tether", __version__)

    def start(
        self,
        name: str,
        kind: str,
        parent: Iterable[tuple[str, Any]] | None = None,
        attributes: Attributes | None = None,
    ) -> Span:
        """Start a span.

        Args:
            name: e.g. ``kas route /gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest``.
            kind: ``server``, ``client`` or ``internal``.
            parent: pairs holding the caller's ``traceparent``/``tracestate`` (metadata, headers), or None for
                the current context (agentk's handler after :meth:`attach`); no valid trace context starts a
                new trace.
            attributes: initial attributes.
        """
        ctx = _PROPAGATOR.extract(_trace_pairs(parent)) if parent is not None else None
        span = self._tracer.start_span(name, context=ctx, kind=_KINDS[kind], attributes=attributes)
        return Span(span)

    def start_child(self, name: str, attributes: Attributes | None = None) -> Span | None:
        """A client span under the current context, or None when no trace is current.

        None keeps background work (e.g. agentk's informers) from starting root traces of its own.
        """
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        return Span(self._tracer.start_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes))

    def attach(self, parent: Iterable[tuple[str, Any]]) -> object:
        """Make the trace context in ``parent`` current in this task; give the result to :meth:`detach`."""
        return otel_context.attach(_PROPAGATOR.extract(_trace_pairs(parent)))

    def detach(self, token: object) -> None:
        """Undo :meth:`attach` (same task)."""
        otel_context.detach(token)  # type: ignore[arg-type]

    def grpc_client_interceptor(self, prefix: str) -> grpc.aio.UnaryUnaryClientInterceptor:
        """An interceptor for a ``grpc.aio`` channel: each unary call is a client span ``<prefix> <method>``.

        The span's ``traceparent`` travels in the call's metadata, so kas continues the trace.
        """
        return _ClientInterceptor(self, prefix)

    def shutdown(self) -> None:
        """Export what is queued (at most a few seconds) and stop the exporter."""
        self._provider.shutdown()


class _ClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, tracer: Tracer, prefix: str) -> None:
        self._tracer = tracer
        self._prefix = prefix

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[grpc.aio.UnaryUnaryCall[Any, Any]]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        method = client_call_details.method
        name = method.decode() if isinstance(method, bytes) else str(method)
        span = self._tracer.start(f"{self._prefix} {name}", "client", None, {"rpc.method": name})
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
        for key, value in span.carrier():
            metadata[key] = value
        details = grpc.aio.ClientCallDetails(
            client_call_details.method,
            client_call_details.timeout,
            metadata,
            client_call_details.credentials,
            client_call_details.wait_for_ready,
        )
        try:
            call = await continuation(details, request)
            code = await call.code()
            span.grpc_status(code.value[0], await call.details() or "")
            return call
        except BaseException as exc:
            span.fail(repr(exc))
            raise
        finally:
            span.end()
