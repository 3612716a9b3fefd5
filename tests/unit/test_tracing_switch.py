"""The tracing switch (issue 25 item 3): off without an endpoint, bad endpoints refused, context replaced per hop."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tether.tool import tracing
from tether.tool.tracing_config import TracingCF


def test_off_without_an_endpoint_loads_no_sdk() -> None:
    code = (
        "import os, sys; os.environ.pop('OTEL_EXPORTER_OTLP_ENDPOINT', None)\n"
        "from tether.tool import tracing\n"
        "assert tracing.setup('tether-kas', None) is None and tracing.TRACER is None\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'SDK loaded'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("endpoint", ["grpc://collector:4317", "collector:4318", "http://", "file:///tmp/x"])
def test_an_endpoint_that_is_not_http_is_refused(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        TracingCF(otlp_endpoint=endpoint)
    monkeypatch.setenv(tracing.ENDPOINT_ENV, endpoint)
    with pytest.raises(ValueError, match="http:// or https://"):
        tracing.setup("tether-kas", None)
    assert tracing.TRACER is None


def test_sampler_ratio_is_a_share() -> None:
    assert TracingCF().sampler_ratio == 1.0
    with pytest.raises(ValueError):
        TracingCF(sampler_ratio=1.5)


def test_each_hop_replaces_the_trace_context() -> None:
    metadata = (("x-request-id", "r1"), ("traceparent", "00-old-old-01"), ("tracestate", "a=b"))
    ours = (("traceparent", "00-new-new-01"),)
    assert tracing.with_trace(metadata, ours) == (("x-request-id", "r1"), ("traceparent", "00-new-new-01"))
