"""``observability.tracing``: the configuration of trace export (kas, hub), apart from the switch itself.

Kept out of :mod:`tether.tool.tracing` so that agentk, which takes the same settings as flags, loads no
pydantic for it (``tests/e2e/test_minimal_imports.py``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tether.tool.tracing import check_endpoint

__all__ = ["TracingCF"]


class TracingCF(BaseModel):
    """``observability.tracing``: where spans go (kas, hub; agentk takes the same as flags).

    Attributes:
        otlp_endpoint: base URL of an OTLP/HTTP receiver, ``http(s)://host:port``; spans are POSTed to
            ``<endpoint>/v1/traces``. None: ``OTEL_EXPORTER_OTLP_ENDPOINT``, else tracing is off.
        sampler_ratio: share of new traces recorded, 0 to 1; a request that arrives with a sampled parent is
            always recorded (parent-based sampling), so one trace is never cut at a hop.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp_endpoint: str | None = None
    sampler_ratio: float = Field(default=1.0, ge=0.0, le=1.0)

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_only(cls, value: str | None) -> str | None:
        return None if value is None else check_endpoint(value)
