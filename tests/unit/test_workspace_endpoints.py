"""agentk's resolution of a workspace Service port to a ready endpoint (EndpointSlices), with a fake API client."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tether.kube.client import KubeApiError
from tether.modules.workspace_access.agent.endpoints import Endpoint, EndpointResolver, ResolveError

AGENT = 7


def service(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {"agent.gitlab.com/id": str(AGENT)} if labels is None else labels,
            "annotations": {"workspaces.gitlab.com/id": "1"},
        },
        "spec": {"ports": [{"name": "editor", "port": 60001, "targetPort": "http"}], **spec},
    }


def slice_(address_type: str, port: int, *endpoints: dict[str, Any], name: str = "editor") -> dict[str, Any]:
    return {"addressType": address_type, "ports": [{"name": name, "port": port}], "endpoints": list(endpoints)}


class FakeKube:
    def __init__(self, svc: dict[str, Any] | None, slices: list[dict[str, Any]]) -> None:
        self.svc, self.slices, self.calls = svc, slices, 0

    async def get_json(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        self.calls += 1
        if "/services/" in path:
            if self.svc is None:
                raise KubeApiError(404, "NotFound", "services not found")
            return self.svc
        assert params == {"labelSelector": "kubernetes.io/service-name=ws"}
        return {"items": self.slices}


async def test_a_ready_endpoint_at_the_target_port_of_the_named_service_port() -> None:
    kube = FakeKube(
        service(),
        [
            slice_("IPv4", 8080, {"addresses": ["10.0.0.9"], "conditions": {"ready": False}}),
            slice_("FQDN", 8080, {"addresses": ["evil.example"]}),
            slice_("IPv4", 9999, {"addresses": ["10.0.0.8"]}, name="other"),
            slice_("IPv4", 8080, {"addresses": ["not-an-ip"]}),
            slice_("IPv6", 8080, {"addresses": ["fd00::5"], "conditions": {}}),
        ],
    )
    now = [0.0]
    resolver = EndpointResolver(kube, ttl_s=5, clock=lambda: now[0])  # type: ignore[arg-type]
    found = await resolver.resolve("ns", "ws", 60001, AGENT)
    assert found == Endpoint("fd00::5", 8080) and found.host == "[fd00::5]"
    await resolver.resolve("ns", "ws", 60001, AGENT)
    assert kube.calls == 2  # cached
    resolver.forget("ns", "ws", 60001)
    await resolver.resolve("ns", "ws", 60001, AGENT)
    assert kube.calls == 4


@pytest.mark.parametrize(
    ("svc", "slices", "code", "text"),
    [
        (None, [], grpc.StatusCode.NOT_FOUND, "does not exist"),
        (service(labels={}), [], grpc.StatusCode.PERMISSION_DENIED, "not a workspace Service of this agent"),
        (service(labels={"agent.gitlab.com/id": "8"}), [], grpc.StatusCode.PERMISSION_DENIED, "not a workspace"),
        (service(type="ExternalName"), [], grpc.StatusCode.PERMISSION_DENIED, "ExternalName"),
        (service(ports=[{"name": "x", "port": 3000}]), [], grpc.StatusCode.NOT_FOUND, "does not expose port 60001"),
        (service(), [], grpc.StatusCode.UNAVAILABLE, "no ready endpoint"),
        (
            service(),
            [slice_("IPv4", 8080, {"addresses": ["10.0.0.1"], "conditions": {"ready": False}})],
            grpc.StatusCode.UNAVAILABLE,
            "no ready endpoint",
        ),
    ],
)
async def test_what_agentk_refuses_to_dial(
    svc: dict[str, Any] | None, slices: list[dict[str, Any]], code: grpc.StatusCode, text: str
) -> None:
    resolver = EndpointResolver(FakeKube(svc, slices))  # type: ignore[arg-type]
    with pytest.raises(ResolveError) as caught:
        await resolver.resolve("ns", "ws", 60001, AGENT)
    assert caught.value.code == code and text in caught.value.message
