"""Distributed tracing switch: OpenTelemetry spans exported over OTLP/HTTP, off by default (issue 25 item 3).

One trace follows a request across every hop: the hub (its kas client), the routing kas (the Kubernetes API
proxy or the api listener, then routing), the gateway kas (forwarding into the tunnel), agentk (the tunnelled
call, then its HTTP request to the API server). W3C trace context (``traceparent``, ``tracestate``) travels in
the gRPC metadata of the routed calls, in the header frame of HTTP over gRPC and in agentk's outbound HTTP
request; each hop replaces it with its own span's.

Off costs nothing: this module imports no OpenTelemetry code, and every instrumented hot path reads only
:data:`TRACER` (None while off). :func:`setup` loads the SDK (``tracing_sdk.py``) when an endpoint is configured
(``observability.tracing.otlp_endpoint``, upstream kas' name, kas.md §7) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set (the OpenTelemetry convention).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from tether.tool.tracing_sdk import Tracer

__all__ = ["ENDPOINT_ENV", "TRACER", "TRACE_KEYS", "check_endpoint", "setup", "shutdown", "with_trace"]

#: The OpenTelemetry variable naming the OTLP endpoint when the configuration does not.
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
#: W3C trace context keys (https://www.w3.org/TR/trace-context/), lower case as gRPC metadata requires.
TRACE_KEYS = ("traceparent", "tracestate")

#: The process' tracer while tracing is on; None (the default) means off. Hot paths check only this.
TRACER: Tracer | None = None


def check_endpoint(value: str) -> str:
    """Return ``value`` if it is an ``http(s)://host[:port]`` URL.

    Raises:
        ValueError: another scheme or no host (upstream kas accepts http and https only, kas.md §7); a typo must
            fail at start, not drop spans later.
    """
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"OTLP endpoint {value!r} must be an http:// or https:// URL with a host")
    return value


def setup(service: str, endpoint: str | None, ratio: float = 1.0, instance: str | None = None) -> Tracer | None:
    """Turn tracing on when an endpoint is given or in ``OTEL_EXPORTER_OTLP_ENDPOINT``; return the tracer or None.

    Args:
        service: ``service.name`` of this process' spans (``tether-kas``, ``tether-agentk``, ``tether-hub``).
        endpoint: OTLP/HTTP base URL (``observability.tracing.otlp_endpoint``), or None for the variable.
        ratio: share of new traces sampled, 0 to 1.
        instance: ``service.instance.id`` (e.g. a kas' private API URL), so two kas in one trace are told apart.

    Raises:
        ValueError: the endpoint is not an http(s) URL.
    """
    global TRACER  # noqa: PLW0603 - the one process-wide switch the hot paths read
    if endpoint is None:
        endpoint = os.environ.get(ENDPOINT_ENV, "").strip() or None
        if endpoint is None:
            return None
    check_endpoint(endpoint)
    from tether.tool.tracing_sdk import Tracer  # noqa: PLC0415 - the SDK loads only when tracing is on

    TRACER = Tracer(service, endpoint, ratio, instance)
    return TRACER


def shutdown() -> None:
    """Export the spans still queued and turn tracing off (at process exit)."""
    global TRACER
    tracer, TRACER = TRACER, None
    if tracer is not None:
        tracer.shutdown()


def with_trace(
    metadata: Iterable[tuple[str, str | bytes]], trace: Sequence[tuple[str, str]]
) -> tuple[tuple[str, str | bytes], ...]:
    """``metadata`` with its trace context replaced by ``trace`` (the next hop's parent is this hop's span)."""
    kept = tuple((k, v) for k, v in metadata if k not in TRACE_KEYS)
    return (*kept, *trace)
