"""The agentk Pods module on the internal server, listing pods of the real cluster (seed 000/001)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from tests.fixtures.k8s import Kubectl
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import KubeCredentials, load_credentials
from tether.modagent.internal_server import InternalServer
from tether.modules.pods.agent import PodsServicer
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2_grpc as reverse_tunnel_grpc
from tether_devenv.cluster import ClusterInfo

pytestmark = pytest.mark.k8s

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: main
    image: registry.invalid/main:1
"""


async def start_server(kube: KubeClient) -> InternalServer:
    server = InternalServer()
    server.add_servicer(rpc_pb2_grpc.add_PodsServicer_to_server, PodsServicer(kube, page_size=2))
    await server.start()
    return server


@pytest.fixture
async def internal(k8s_cluster: ClusterInfo) -> AsyncIterator[InternalServer]:
    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    server = await start_server(kube)
    try:
        yield server
    finally:
        await server.stop(None)
        await kube.close()


async def test_descriptor_lists_the_registered_apis_but_not_the_tunnel() -> None:
    server = InternalServer()
    server.add_servicer(rpc_pb2_grpc.add_PodsServicer_to_server, rpc_pb2_grpc.PodsServicer())
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_handler("tether.test.Echo", {"Ping": echo, "Pong": echo})
    server.add_servicer(
        reverse_tunnel_grpc.add_ReverseTunnelServicer_to_server, reverse_tunnel_grpc.ReverseTunnelServicer()
    )
    descriptor = server.descriptor()
    assert [(s.name, [m.name for m in s.methods]) for s in descriptor.services] == [
        ("gitlab.agent.pods.rpc.Pods", ["GetPods"]),
        ("tether.test.Echo", ["Ping", "Pong"]),
    ]


async def test_get_pods_lists_pods_of_all_namespaces(
    internal: InternalServer, kubectl: Kubectl, k8s_namespace: str
) -> None:
    for name in ("web-b", "web-a"):
        kubectl.run("apply", "-n", k8s_namespace, "-f", "-", input_text=POD.format(name=name))

    response = await rpc_pb2_grpc.PodsStub(internal.channel).GetPods(rpc_pb2.GetPodsRequest(agent_id=1))

    pods = [(p.namespace, p.name) for p in response.pods]
    assert (k8s_namespace, "web-a") in pods
    assert (k8s_namespace, "web-b") in pods
    assert pods == sorted(pods)
    expected = {
        (item["metadata"]["namespace"], item["metadata"]["name"])
        for item in kubectl.json("get", "pods", "--all-namespaces")["items"]
    }
    assert expected <= set(pods)


async def test_get_pods_as_raw_bytes_like_a_tunnel(internal: InternalServer, k8s_namespace: str) -> None:
    # The reverse tunnel calls the internal server without (de)serializers (kas.md §1.4).
    call = internal.channel.stream_stream("/gitlab.agent.pods.rpc.Pods/GetPods")()
    await call.write(rpc_pb2.GetPodsRequest().SerializeToString())
    await call.done_writing()
    raw = await call.read()
    assert isinstance(raw, bytes)
    assert await call.read() is aio.EOF
    assert await call.code() is grpc.StatusCode.OK
    assert rpc_pb2.GetPodsResponse.FromString(raw).pods


async def test_api_server_errors_become_unavailable(k8s_cluster: ClusterInfo) -> None:
    kube = KubeClient(
        KubeCredentials(server=k8s_cluster.server, ca_pem=k8s_cluster.ca_file.read_bytes(), token="not-a-token")
    )
    server = await start_server(kube)
    try:
        with pytest.raises(aio.AioRpcError) as caught:
            await rpc_pb2_grpc.PodsStub(server.channel).GetPods(rpc_pb2.GetPodsRequest())
    finally:
        await server.stop(None)
        await kube.close()
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "listing pods from the Kubernetes API failed" in (caught.value.details() or "")
    assert "Unauthorized" in (caught.value.details() or "")
