"""Every gRPC listener can serve TLS with its own certificate; routing and agentk work over it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.fixtures.hub import RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import System
from tether.hub.kas_client import KasApiClient
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo

pytestmark = [pytest.mark.k8s, pytest.mark.redis]


async def test_tls_on_agent_api_and_private_listeners(
    system: System, k8s_cluster: ClusterInfo, kubectl: Kubectl, k8s_namespace: str, kas_hub: RealHub, tmp_path: Path
) -> None:
    kubectl.run("run", "tls-pod", "-n", k8s_namespace, "--image=registry.invalid/x:1", "--restart=Never")
    material = pki.generate(tmp_path / "pki")
    tls = {"certificate_file": str(material.serving_cert), "key_file": str(material.serving_key)}
    listeners = {
        "agent": {"listen": tls},
        "api": {"listen": tls},
        "private_api": {"listen": {**tls, "ca_certificate_file": str(material.ca_cert)}},
    }
    kas1, kas2 = system.kas(**listeners), system.kas(**listeners)
    assert kas1.private_url.startswith("grpc://")  # the fixture's name for the port; kas itself uses grpcs
    token = "tls-agent-token"
    kas_hub.add_agent(token, 401, 4)
    system.agentk_at(token, f"grpcs://127.0.0.1:{kas2.ports['agent']}", "tls-agent", ca_cert=material.ca_cert)
    credentials = grpc.ssl_channel_credentials(root_certificates=material.ca_cert.read_bytes())
    client = KasApiClient(kas1.api_target, kas_hub.secret, credentials)
    try:
        pods = await client.get_pods(401, timeout_s=30)
        assert (k8s_namespace, "tls-pod") in {(p.namespace, p.name) for p in pods}
    finally:
        await client.close()
    plaintext = KasApiClient(kas1.api_target, kas_hub.secret)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await plaintext.connected_agents_by_agent_id(401, timeout_s=3)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await plaintext.close()
