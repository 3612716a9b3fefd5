"""Audit events as kas sends them, for the hub's audit tests (AUDIT_CONTRACT.md)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from tests.fixtures.hub import RealHub


def event(agent_id: int, **fields: Any) -> dict[str, Any]:
    """An ``AuditEvent`` as JSON: ``get pods`` in ``default`` through agent ``agent_id``, 200; ``fields`` override."""
    return {
        "id": uuid.uuid4().hex,
        "time": time.time(),
        "kind": "kubernetes_api",
        "agent_id": agent_id,
        "kas_instance": "kas-0",
        "verb": "get",
        "status": 200,
        "duration_ms": 3.5,
        "bytes_out": 120,
        "api_version": "v1",
        "resource": "pods",
        "namespace": "default",
        "path": "/api/v1/namespaces/default/pods",
        "request_id": uuid.uuid4().hex[:16],
        "source_address": "10.0.0.7:51234",
        "cluster_identity": {"kind": "agent"},
        **fields,
    }


def post_events(hub: RealHub, events: list[dict[str, Any]]) -> httpx.Response:
    """``POST /api/v4/internal/kubernetes/audit_events`` with kas' JWT."""
    with httpx.Client(base_url=hub.api_url, headers=hub.kas_headers(), timeout=60) as client:
        return client.post("/internal/kubernetes/audit_events", json={"events": events})


def store(hub: RealHub, events: list[dict[str, Any]]) -> None:
    """Post ``events`` and check every one was new."""
    response = post_events(hub, events)
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": len(events), "duplicates": 0}
