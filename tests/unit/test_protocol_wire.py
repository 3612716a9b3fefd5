"""Wire compatibility of the tunnel and routing messages with upstream (kas.md §1.2, §2.3, §3.1, §3.3, §5.2, §6).

Three independent checks: the descriptors against tables written here from kas.md, every message
round-tripped with every field set, and encodings compared with protobuf bytes computed by hand (so the
result does not rest only on our own descriptors).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, unknown_fields
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.rpc import status_pb2

from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2 as agent_configuration_rpc
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2_grpc as agent_configuration_grpc
from tether.pb.gitlab.agent.agent_tracker import agent_tracker_pb2
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2 as agent_tracker_rpc
from tether.pb.gitlab.agent.agent_tracker.rpc import rpc_pb2_grpc as agent_tracker_grpc
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2
from tether.pb.gitlab.agent.entity import entity_pb2
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.kas import kasapp_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2 as kubernetes_api_rpc
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2_grpc as kubernetes_api_grpc
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.pb.gitlab.agent.redistool import redistool_pb2
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2 as reverse_tunnel_rpc
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2_grpc as reverse_tunnel_grpc

VALUES_MAP = "map<string, gitlab.agent.prototool.Values>"

# (full name, {field: (number, type)}, {oneof: fields}) written from kas.md, not from our descriptors.
# Types use .proto spelling; "optional" means proto3 explicit presence. entity.* scalar types are not
# spelled out in kas.md §3.3; they are strings upstream (pkg/entity/entity.proto).
REFERENCE: list[tuple[str, dict[str, tuple[int, str]], dict[str, tuple[str, ...]]]] = [
    # §1.2 reverse tunnel
    ("gitlab.agent.reverse_tunnel.info.Method", {"name": (1, "string")}, {}),
    (
        "gitlab.agent.reverse_tunnel.info.Service",
        {"name": (1, "string"), "methods": (2, "repeated gitlab.agent.reverse_tunnel.info.Method")},
        {},
    ),
    (
        "gitlab.agent.reverse_tunnel.info.AgentDescriptor",
        {"services": (1, "repeated gitlab.agent.reverse_tunnel.info.Service")},
        {},
    ),
    ("gitlab.agent.prototool.Values", {"value": (1, "repeated string")}, {}),
    (
        "gitlab.agent.reverse_tunnel.rpc.Descriptor",
        {"agent_descriptor": (1, "gitlab.agent.reverse_tunnel.info.AgentDescriptor")},
        {},
    ),
    ("gitlab.agent.reverse_tunnel.rpc.Header", {"meta": (1, VALUES_MAP)}, {}),
    ("gitlab.agent.reverse_tunnel.rpc.Message", {"data": (1, "bytes")}, {}),
    ("gitlab.agent.reverse_tunnel.rpc.Trailer", {"meta": (1, VALUES_MAP)}, {}),
    ("gitlab.agent.reverse_tunnel.rpc.Error", {"status": (1, "google.rpc.Status")}, {}),
    (
        "gitlab.agent.reverse_tunnel.rpc.ConnectRequest",
        {
            "descriptor": (1, "gitlab.agent.reverse_tunnel.rpc.Descriptor"),
            "header": (2, "gitlab.agent.reverse_tunnel.rpc.Header"),
            "message": (3, "gitlab.agent.reverse_tunnel.rpc.Message"),
            "trailer": (4, "gitlab.agent.reverse_tunnel.rpc.Trailer"),
            "error": (5, "gitlab.agent.reverse_tunnel.rpc.Error"),
        },
        {"msg": ("descriptor", "header", "message", "trailer", "error")},
    ),
    (
        "gitlab.agent.reverse_tunnel.rpc.RequestInfo",
        {"method_name": (1, "string"), "meta": (2, VALUES_MAP)},
        {},
    ),
    ("gitlab.agent.reverse_tunnel.rpc.CloseSend", {}, {}),
    (
        "gitlab.agent.reverse_tunnel.rpc.ConnectResponse",
        {
            "request_info": (1, "gitlab.agent.reverse_tunnel.rpc.RequestInfo"),
            "message": (2, "gitlab.agent.reverse_tunnel.rpc.Message"),
            "close_send": (3, "gitlab.agent.reverse_tunnel.rpc.CloseSend"),
        },
        {"msg": ("request_info", "message", "close_send")},
    ),
    # §2.3 kas <-> kas
    ("gitlab.agent.kas.StartStreaming", {}, {}),
    ("gitlab.agent.kas.GatewayKasResponse.TunnelReady", {}, {}),
    ("gitlab.agent.kas.GatewayKasResponse.Header", {"meta": (1, VALUES_MAP)}, {}),
    ("gitlab.agent.kas.GatewayKasResponse.Message", {"data": (1, "bytes")}, {}),
    ("gitlab.agent.kas.GatewayKasResponse.Trailer", {"meta": (1, VALUES_MAP)}, {}),
    ("gitlab.agent.kas.GatewayKasResponse.Error", {"status": (1, "google.rpc.Status")}, {}),
    ("gitlab.agent.kas.GatewayKasResponse.NoTunnel", {}, {}),
    (
        "gitlab.agent.kas.GatewayKasResponse",
        {
            "tunnel_ready": (1, "gitlab.agent.kas.GatewayKasResponse.TunnelReady"),
            "header": (2, "gitlab.agent.kas.GatewayKasResponse.Header"),
            "message": (3, "gitlab.agent.kas.GatewayKasResponse.Message"),
            "trailer": (4, "gitlab.agent.kas.GatewayKasResponse.Trailer"),
            "error": (5, "gitlab.agent.kas.GatewayKasResponse.Error"),
            "no_tunnel": (6, "gitlab.agent.kas.GatewayKasResponse.NoTunnel"),
        },
        {"msg": ("tunnel_ready", "header", "message", "trailer", "error", "no_tunnel")},
    ),
    # §5.2 HTTP over gRPC
    (
        "gitlab.agent.prototool.HttpRequest",
        {"method": (1, "string"), "header": (2, VALUES_MAP), "url_path": (3, "string"), "query": (4, VALUES_MAP)},
        {},
    ),
    (
        "gitlab.agent.prototool.HttpResponse",
        {"status_code": (1, "int32"), "status": (2, "string"), "header": (3, VALUES_MAP)},
        {},
    ),
    (
        "gitlab.agent.grpctool.HttpRequest.Header",
        {
            "request": (1, "gitlab.agent.prototool.HttpRequest"),
            "extra": (2, "google.protobuf.Any"),
            "content_length": (3, "optional int64"),
        },
        {},
    ),
    ("gitlab.agent.grpctool.HttpRequest.Data", {"data": (1, "bytes")}, {}),
    ("gitlab.agent.grpctool.HttpRequest.Trailer", {}, {}),
    ("gitlab.agent.grpctool.HttpRequest.UpgradeData", {"data": (1, "bytes")}, {}),
    (
        "gitlab.agent.grpctool.HttpRequest",
        {
            "header": (1, "gitlab.agent.grpctool.HttpRequest.Header"),
            "data": (2, "gitlab.agent.grpctool.HttpRequest.Data"),
            "trailer": (3, "gitlab.agent.grpctool.HttpRequest.Trailer"),
            "upgradeData": (4, "gitlab.agent.grpctool.HttpRequest.UpgradeData"),
        },
        {"message": ("header", "data", "trailer", "upgradeData")},
    ),
    (
        "gitlab.agent.grpctool.HttpResponse.Header",
        {"response": (1, "gitlab.agent.prototool.HttpResponse")},
        {},
    ),
    ("gitlab.agent.grpctool.HttpResponse.Data", {"data": (1, "bytes")}, {}),
    ("gitlab.agent.grpctool.HttpResponse.Trailer", {}, {}),
    ("gitlab.agent.grpctool.HttpResponse.UpgradeData", {"data": (1, "bytes")}, {}),
    (
        "gitlab.agent.grpctool.HttpResponse",
        {
            "header": (1, "gitlab.agent.grpctool.HttpResponse.Header"),
            "data": (2, "gitlab.agent.grpctool.HttpResponse.Data"),
            "trailer": (3, "gitlab.agent.grpctool.HttpResponse.Trailer"),
            "upgradeData": (4, "gitlab.agent.grpctool.HttpResponse.UpgradeData"),
        },
        {"message": ("header", "data", "trailer", "upgradeData")},
    ),
    (
        "gitlab.agent.kubernetes_api.rpc.HeaderExtra",
        {"imp_config": (1, "gitlab.agent.kubernetes_api.rpc.ImpersonationConfig")},
        {},
    ),
    (
        "gitlab.agent.kubernetes_api.rpc.ImpersonationConfig",
        {
            "username": (1, "string"),
            "groups": (2, "repeated string"),
            "uid": (3, "string"),
            "extra": (4, "repeated gitlab.agent.kubernetes_api.rpc.ExtraKeyVal"),
        },
        {},
    ),
    (
        "gitlab.agent.kubernetes_api.rpc.ExtraKeyVal",
        {"key": (1, "string"), "val": (2, "repeated string")},
        {},
    ),
    # §3.1 / §3.3 Redis values and the agent tracker
    ("gitlab.agent.redistool.ExpiringValue", {"expires_at": (1, "int64"), "value": (2, "bytes")}, {}),
    ("gitlab.agent.redistool.ExpiringValueTimestamp", {"expires_at": (1, "int64")}, {}),
    (
        "gitlab.agent.agent_tracker.ConnectedAgentInfo",
        {
            "agent_meta": (1, "gitlab.agent.entity.AgentMeta"),
            "connected_at": (2, "google.protobuf.Timestamp"),
            "connection_id": (3, "int64"),
            "agent_id": (4, "int64"),
            "project_id": (5, "int64"),
        },
        {},
    ),
    (
        "gitlab.agent.entity.AgentMeta",
        {
            "version": (1, "string"),
            "commit_id": (2, "string"),
            "pod_namespace": (3, "string"),
            "pod_name": (4, "string"),
            "kubernetes_version": (5, "gitlab.agent.entity.KubernetesVersion"),
        },
        {},
    ),
    (
        "gitlab.agent.entity.KubernetesVersion",
        {"major": (1, "string"), "minor": (2, "string"), "git_version": (3, "string"), "platform": (4, "string")},
        {},
    ),
    (
        "gitlab.agent.agent_tracker.rpc.GetConnectedAgentsRequest",
        {"project_id": (1, "int64"), "agent_id": (2, "int64")},
        {"request": ("project_id", "agent_id")},
    ),
    (
        "gitlab.agent.agent_tracker.rpc.GetConnectedAgentsResponse",
        {"agents": (1, "repeated gitlab.agent.agent_tracker.ConnectedAgentInfo")},
        {},
    ),
    # §6.2 configuration stream
    (
        "gitlab.agent.agent_configuration.rpc.ConfigurationRequest",
        {"commit_id": (1, "string"), "agent_meta": (2, "gitlab.agent.entity.AgentMeta"), "skip_register": (3, "bool")},
        {},
    ),
    (
        "gitlab.agent.agent_configuration.rpc.ConfigurationResponse",
        {"configuration": (1, "gitlab.agent.agentcfg.AgentConfiguration"), "commit_id": (2, "string")},
        {},
    ),
]

#: Tether fields added to upstream messages (docs/protocol.md §8): numbers from 100 up, so upstream, which does
#: not know them, skips them as unknown fields.
TETHER_FIELDS: dict[str, dict[str, tuple[int, str]]] = {
    "gitlab.agent.agent_tracker.ConnectedAgentInfo": {"kas_url": (100, "string")},
}

# kas.md §6.1 gives numbers (not types) for these agentcfg messages.
AGENTCFG_NUMBERS: list[tuple[str, dict[str, int]]] = [
    (
        "gitlab.agent.agentcfg.ConfigurationFile",
        {
            "gitops": 1,
            "observability": 2,
            "ci_access": 4,
            "container_scanning": 5,
            "user_access": 6,
            "remote_development": 7,
            "flux": 8,
        },
    ),
    (
        "gitlab.agent.agentcfg.AgentConfiguration",
        {
            "gitops": 1,
            "observability": 2,
            "agent_id": 4,
            "project_id": 5,
            "ci_access": 6,
            "container_scanning": 7,
            "project_path": 8,
            "remote_development": 9,
            "flux": 10,
            "gitlab_external_url": 11,
        },
    ),
]

MODULES = [
    reverse_tunnel_rpc,
    info_pb2,
    kasapp_pb2,
    prototool_pb2,
    grpctool_pb2,
    kubernetes_api_rpc,
    redistool_pb2,
    agent_tracker_pb2,
    entity_pb2,
    agent_tracker_rpc,
    agent_configuration_rpc,
    agentcfg_pb2,
]

SCALARS = {
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def descriptors() -> dict[str, Descriptor]:
    found: dict[str, Descriptor] = {}

    def walk(desc: Descriptor) -> None:
        found[desc.full_name] = desc
        for nested in desc.nested_types:
            walk(nested)

    for module in MODULES:
        for desc in module.DESCRIPTOR.message_types_by_name.values():
            walk(desc)
    return found


ALL = descriptors()


def proto3_optional(field: FieldDescriptor) -> bool:
    proto = descriptor_pb2.DescriptorProto()
    assert field.containing_type is not None
    field.containing_type.CopyToProto(proto)
    return next(f for f in proto.field if f.name == field.name).proto3_optional


def type_of(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return f"map<{type_of(key)}, {type_of(value)}>"
    base = field.message_type.full_name if field.message_type is not None else SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    return f"optional {base}" if proto3_optional(field) else base


def real_oneofs(desc: Descriptor) -> dict[str, tuple[str, ...]]:
    return {
        o.name: tuple(f.name for f in o.fields)
        for o in desc.oneofs
        if not (len(o.fields) == 1 and proto3_optional(o.fields[0]))
    }


@pytest.mark.parametrize(("full_name", "fields", "oneofs"), REFERENCE, ids=[r[0] for r in REFERENCE])
def test_fields_match_reference(
    full_name: str, fields: dict[str, tuple[int, str]], oneofs: dict[str, tuple[str, ...]]
) -> None:
    desc = ALL[full_name]
    assert {f.name: (f.number, type_of(f)) for f in desc.fields} == fields | TETHER_FIELDS.get(full_name, {})
    assert real_oneofs(desc) == oneofs


def test_tether_fields_are_skipped_by_upstream_readers() -> None:
    assert all(number >= 100 for fields in TETHER_FIELDS.values() for number, _ in fields.values())
    # An upstream reader knows fields 1..5 only: strip ours from a copy of the descriptor and decode with it.
    proto = descriptor_pb2.FileDescriptorProto()
    agent_tracker_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = "upstream_agent_tracker.proto", "upstream"
    message = next(m for m in proto.message_type if m.name == "ConnectedAgentInfo")
    kept = [f for f in message.field if f.number < 100]
    del message.field[:]
    message.field.extend(kept)
    pool = descriptor_pool.DescriptorPool()
    for dependency in (timestamp_pb2.DESCRIPTOR, entity_pb2.DESCRIPTOR):
        dependency_proto = descriptor_pb2.FileDescriptorProto()
        dependency.CopyToProto(dependency_proto)
        pool.Add(dependency_proto)
    pool.Add(proto)
    upstream = message_factory.GetMessageClass(pool.FindMessageTypeByName("upstream.ConnectedAgentInfo"))
    ours = agent_tracker_pb2.ConnectedAgentInfo()
    ours.CopyFrom(CONNECTED)
    ours.kas_url = "grpc://10.0.0.5:8155"
    decoded = upstream.FromString(ours.SerializeToString())
    assert (decoded.connection_id, decoded.agent_id, decoded.project_id) == (-7, 42, 9)
    assert decoded.agent_meta.pod_name == "agentk-0"
    assert agent_tracker_pb2.ConnectedAgentInfo.FromString(CONNECTED.SerializeToString()).kas_url == ""


@pytest.mark.parametrize(("full_name", "numbers"), AGENTCFG_NUMBERS, ids=[r[0] for r in AGENTCFG_NUMBERS])
def test_agentcfg_top_level_numbers(full_name: str, numbers: dict[str, int]) -> None:
    desc = ALL[full_name]
    assert {f.name: f.number for f in desc.fields} == numbers
    # Field 3 was used upstream once; reusing it would misread old data.
    proto = descriptor_pb2.DescriptorProto()
    desc.CopyToProto(proto)
    assert [(r.start, r.end) for r in proto.reserved_range] == [(3, 4)]


@pytest.mark.parametrize(
    ("full_name", "oneof", "numbers"),
    [
        ("gitlab.agent.agentcfg.CiAccessAsCF", "as", {"agent": 1, "impersonate": 2, "ci_job": 3}),
        ("gitlab.agent.agentcfg.UserAccessAsCF", "as", {"agent": 1, "user": 3}),
    ],
)
def test_access_as_oneof_numbers(full_name: str, oneof: str, numbers: dict[str, int]) -> None:
    group = ALL[full_name].oneofs_by_name[oneof]
    assert {f.name: f.number for f in group.fields} == numbers


def test_reference_table_covers_streamed_and_routing_messages() -> None:
    # Every message of the tunnel/routing/HTTP/tracker files must be in the reference table.
    in_scope = [reverse_tunnel_rpc, info_pb2, kasapp_pb2, prototool_pb2, grpctool_pb2, kubernetes_api_rpc]
    in_scope += [redistool_pb2, agent_tracker_pb2, entity_pb2, agent_tracker_rpc, agent_configuration_rpc]
    names = {name for name, desc in ALL.items() if desc.file.name in {m.DESCRIPTOR.name for m in in_scope}}
    names = {n for n in names if not ALL[n].GetOptions().map_entry}
    assert names == {r[0] for r in REFERENCE}


# ---- services ------------------------------------------------------------------------------------

SERVICES = [
    (
        reverse_tunnel_rpc,
        "/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect",
        "gitlab.agent.reverse_tunnel.rpc.ConnectRequest",
        "gitlab.agent.reverse_tunnel.rpc.ConnectResponse",
        True,
        True,
    ),
    (
        kubernetes_api_rpc,
        "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest",
        "gitlab.agent.grpctool.HttpRequest",
        "gitlab.agent.grpctool.HttpResponse",
        True,
        True,
    ),
    (
        agent_configuration_rpc,
        "/gitlab.agent.agent_configuration.rpc.AgentConfiguration/GetConfiguration",
        "gitlab.agent.agent_configuration.rpc.ConfigurationRequest",
        "gitlab.agent.agent_configuration.rpc.ConfigurationResponse",
        False,
        True,
    ),
    (
        agent_tracker_rpc,
        "/gitlab.agent.agent_tracker.rpc.AgentTracker/GetConnectedAgents",
        "gitlab.agent.agent_tracker.rpc.GetConnectedAgentsRequest",
        "gitlab.agent.agent_tracker.rpc.GetConnectedAgentsResponse",
        False,
        False,
    ),
]


@pytest.mark.parametrize(
    ("module", "path", "request_type", "response_type", "client_streaming", "server_streaming"),
    SERVICES,
    ids=[s[1] for s in SERVICES],
)
def test_service_descriptor(
    module: Any, path: str, request_type: str, response_type: str, client_streaming: bool, server_streaming: bool
) -> None:
    service_name, method_name = path.lstrip("/").split("/")
    services = list(module.DESCRIPTOR.services_by_name.values())
    assert [s.full_name for s in services] == [service_name]
    assert [m.name for m in services[0].methods] == [method_name]
    method = services[0].methods_by_name[method_name]
    assert method.input_type.full_name == request_type
    assert method.output_type.full_name == response_type
    assert (method.client_streaming, method.server_streaming) == (client_streaming, server_streaming)


class RecordingChannel:
    """Stands in for grpc.Channel to see which path and call kind the generated stubs use."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def _record(self, kind: str) -> Any:
        def factory(path: str, *args: Any, **kwargs: Any) -> None:
            self.calls.append((kind, path))

        return factory

    def __getattr__(self, kind: str) -> Any:
        if kind in {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}:
            return self._record(kind)
        raise AttributeError(kind)


@pytest.mark.parametrize(
    ("stub", "call"),
    [
        (reverse_tunnel_grpc.ReverseTunnelStub, ("stream_stream", SERVICES[0][1])),
        (kubernetes_api_grpc.KubernetesApiStub, ("stream_stream", SERVICES[1][1])),
        (agent_configuration_grpc.AgentConfigurationStub, ("unary_stream", SERVICES[2][1])),
        (agent_tracker_grpc.AgentTrackerStub, ("unary_unary", SERVICES[3][1])),
    ],
)
def test_generated_stub_paths(stub: Any, call: tuple[str, str]) -> None:
    channel = RecordingChannel()
    stub(channel)
    assert channel.calls == [call]


# ---- round trips -----------------------------------------------------------------------------------

V = prototool_pb2.Values
STATUS = status_pb2.Status(code=14, message="agent gone", details=[any_pb2.Any(type_url="t/x", value=b"\x01")])
AGENT_META = entity_pb2.AgentMeta(
    version="v16.5.0",
    commit_id="8daa08cc",
    pod_namespace="gitlab-agent",
    pod_name="agentk-0",
    kubernetes_version=entity_pb2.KubernetesVersion(
        major="1", minor="28", git_version="v1.28.3", platform="linux/amd64"
    ),
)
CONNECTED = agent_tracker_pb2.ConnectedAgentInfo(
    agent_meta=AGENT_META,
    connected_at=timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5),
    connection_id=-7,  # random int63 upstream; negative values must survive too
    agent_id=42,
    project_id=9,
)
AGENT_DESCRIPTOR = info_pb2.AgentDescriptor(
    services=[
        info_pb2.Service(
            name="gitlab.agent.kubernetes_api.rpc.KubernetesApi", methods=[info_pb2.Method(name="MakeRequest")]
        )
    ]
)
META = {"content-type": V(value=["application/grpc"]), "x-multi": V(value=["a", "b", ""])}
IMP = kubernetes_api_rpc.ImpersonationConfig(
    username="gitlab:ci_job:1",
    groups=["gitlab:ci_job", "gitlab:project:9"],
    uid="u-1",
    extra=[kubernetes_api_rpc.ExtraKeyVal(key="agent.gitlab.com/id", val=["42"])],
)
EXTRA = any_pb2.Any()
EXTRA.Pack(kubernetes_api_rpc.HeaderExtra(imp_config=IMP))
HTTP_REQUEST = prototool_pb2.HttpRequest(
    method="GET",
    header={"Accept": V(value=["application/json"])},
    url_path="/api/v1/pods",
    query={"watch": V(value=["1"])},
)
HTTP_RESPONSE = prototool_pb2.HttpResponse(status_code=200, status="200 OK", header={"Content-Type": V(value=["x"])})
RT = reverse_tunnel_rpc
GW = kasapp_pb2.GatewayKasResponse
GREQ = grpctool_pb2.HttpRequest
GRESP = grpctool_pb2.HttpResponse
HTTP_HEADER = GREQ(header=GREQ.Header(request=HTTP_REQUEST, extra=EXTRA, content_length=-1))

SAMPLES: list[Message] = [
    RT.ConnectRequest(descriptor=RT.Descriptor(agent_descriptor=AGENT_DESCRIPTOR)),
    RT.ConnectRequest(header=RT.Header(meta=META)),
    RT.ConnectRequest(message=RT.Message(data=b"\x00\x01raw")),
    RT.ConnectRequest(trailer=RT.Trailer(meta=META)),
    RT.ConnectRequest(error=RT.Error(status=STATUS)),
    RT.ConnectResponse(request_info=RT.RequestInfo(method_name=SERVICES[1][1], meta=META)),
    RT.ConnectResponse(message=RT.Message(data=b"req")),
    RT.ConnectResponse(close_send=RT.CloseSend()),
    kasapp_pb2.StartStreaming(),
    GW(tunnel_ready=GW.TunnelReady()),
    GW(header=GW.Header(meta=META)),
    GW(message=GW.Message(data=b"resp")),
    GW(trailer=GW.Trailer(meta=META)),
    GW(error=GW.Error(status=STATUS)),
    GW(no_tunnel=GW.NoTunnel()),
    HTTP_HEADER,
    GREQ(data=GREQ.Data(data=b"body")),
    GREQ(trailer=GREQ.Trailer()),
    GREQ(upgradeData=GREQ.UpgradeData(data=b"spdy")),
    GRESP(header=GRESP.Header(response=HTTP_RESPONSE)),
    GRESP(data=GRESP.Data(data=b"chunk")),
    GRESP(trailer=GRESP.Trailer()),
    GRESP(upgradeData=GRESP.UpgradeData(data=b"ws")),
    kubernetes_api_rpc.HeaderExtra(imp_config=IMP),
    redistool_pb2.ExpiringValue(expires_at=1_700_000_300, value=CONNECTED.SerializeToString()),
    redistool_pb2.ExpiringValueTimestamp(expires_at=1_700_000_300),
    CONNECTED,
    agent_tracker_rpc.GetConnectedAgentsRequest(project_id=9),
    agent_tracker_rpc.GetConnectedAgentsRequest(agent_id=42),
    agent_tracker_rpc.GetConnectedAgentsResponse(agents=[CONNECTED, CONNECTED]),
    agent_configuration_rpc.ConfigurationRequest(commit_id="abc", agent_meta=AGENT_META, skip_register=True),
    agent_configuration_rpc.ConfigurationResponse(
        configuration=agentcfg_pb2.AgentConfiguration(agent_id=42, project_id=9, project_path="group/project"),
        commit_id="abc",
    ),
]


def sample_id(msg: Message) -> str:
    name = msg.DESCRIPTOR.full_name.removeprefix("gitlab.agent.")
    fields = msg.ListFields()
    return f"{name}.{fields[0][0].name}" if msg.DESCRIPTOR.oneofs and fields else name


def set_fields(msg: Message) -> Iterator[tuple[str, str]]:
    """Yield (message full name, field name) for every field set anywhere inside msg."""
    for field, value in msg.ListFields():
        yield msg.DESCRIPTOR.full_name, field.name
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            values = value.values() if field.message_type.fields_by_name["value"].message_type else []
        elif field.is_repeated:
            values = value
        else:
            values = [value]
        for item in values:
            yield msg.DESCRIPTOR.full_name, field.name
            # Empty sub-messages still count as encoded, so record the type itself too.
            yield item.DESCRIPTOR.full_name, ""
            yield from set_fields(item)


@pytest.mark.parametrize("msg", SAMPLES, ids=[sample_id(m) for m in SAMPLES])
def test_round_trip(msg: Message) -> None:
    data = msg.SerializeToString(deterministic=True)
    decoded = type(msg).FromString(data)
    assert decoded == msg
    assert decoded.SerializeToString(deterministic=True) == data
    assert len(unknown_fields.UnknownFieldSet(decoded)) == 0


def test_every_reference_field_round_tripped() -> None:
    # Every field of every reference message must hold a non-default value in at least one sample, and
    # every reference message (also the empty ones) must be encoded at least once.
    covered = {pair for msg in SAMPLES for pair in set_fields(msg)}
    covered |= {(msg.DESCRIPTOR.full_name, "") for msg in SAMPLES}
    missing = [
        (name, field)
        for name, fields, _ in REFERENCE
        for field in [*fields, ""]
        if (name, field) not in covered and not (field == "" and fields)
    ]
    assert missing == []


def test_header_extra_travels_in_any() -> None:
    header = GREQ.FromString(HTTP_HEADER.SerializeToString()).header
    assert header.extra.type_url == "type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra"
    extra = kubernetes_api_rpc.HeaderExtra()
    assert header.extra.Unpack(extra)
    assert extra.imp_config == IMP


def test_values_map_keeps_value_order() -> None:
    decoded = RT.Header.FromString(RT.Header(meta=META).SerializeToString())
    assert list(decoded.meta["x-multi"].value) == ["a", "b", ""]


def test_content_length_presence() -> None:
    # 0 ("no body") must be distinguishable from unset ("unknown" before content_length existed).
    assert not GREQ.Header().HasField("content_length")
    zero = GREQ.Header.FromString(GREQ.Header(content_length=0).SerializeToString())
    assert zero.HasField("content_length")
    assert zero.content_length == 0


def test_expiring_value_timestamp_decodes_timestamp_only() -> None:
    stored = redistool_pb2.ExpiringValue(expires_at=1_700_000_300, value=CONNECTED.SerializeToString())
    ts = redistool_pb2.ExpiringValueTimestamp.FromString(stored.SerializeToString())
    assert ts.expires_at == 1_700_000_300
    value = agent_tracker_pb2.ConnectedAgentInfo.FromString(
        redistool_pb2.ExpiringValue.FromString(stored.SerializeToString()).value
    )
    assert value == CONNECTED


# ---- hand-computed bytes ---------------------------------------------------------------------------
# Tag byte = (field number << 3) | wire type; wire type 0 = varint, 2 = length-delimited.

HAND_ENCODED = [
    pytest.param(RT.ConnectResponse(close_send=RT.CloseSend()), b"\x1a\x00", id="close_send"),
    pytest.param(redistool_pb2.ExpiringValue(expires_at=5, value=b"x"), b"\x08\x05\x12\x01x", id="expiring_value"),
    pytest.param(RT.ConnectRequest(message=RT.Message(data=b"hi")), b"\x1a\x04\x0a\x02hi", id="request_message"),
    pytest.param(
        RT.ConnectRequest(
            descriptor=RT.Descriptor(
                agent_descriptor=info_pb2.AgentDescriptor(
                    services=[info_pb2.Service(name="s", methods=[info_pb2.Method(name="m")])]
                )
            )
        ),
        # Request(1: Descriptor(1: AgentDescriptor(1: Service(1: "s", 2: Method(1: "m")))))
        b"\x0a\x0c" + b"\x0a\x0a" + b"\x0a\x08" + b"\x0a\x01s" + b"\x12\x03\x0a\x01m",
        id="descriptor",
    ),
    pytest.param(
        RT.ConnectRequest(error=RT.Error(status=status_pb2.Status(code=5, message="x"))),
        b"\x2a\x07" + b"\x0a\x05" + b"\x08\x05\x12\x01x",
        id="request_error",
    ),
    pytest.param(
        RT.ConnectResponse(request_info=RT.RequestInfo(method_name="/a", meta={"k": V(value=["v"])})),
        # RequestInfo(1: "/a", 2: map entry(1: "k", 2: Values(1: "v")))
        b"\x0a\x0e" + b"\x0a\x02/a" + b"\x12\x08" + b"\x0a\x01k" + b"\x12\x03\x0a\x01v",
        id="request_info_meta",
    ),
    pytest.param(GW(tunnel_ready=GW.TunnelReady()), b"\x0a\x00", id="tunnel_ready"),
    pytest.param(GW(no_tunnel=GW.NoTunnel()), b"\x32\x00", id="no_tunnel"),
    pytest.param(kasapp_pb2.StartStreaming(), b"", id="start_streaming"),
    pytest.param(
        GREQ(header=GREQ.Header(request=prototool_pb2.HttpRequest(method="GET", url_path="/"), content_length=0)),
        # Header(1: HttpRequest(1: "GET", 3: "/"), 3: 0) -- the explicit 0 is encoded because of presence.
        b"\x0a\x0c" + b"\x0a\x08" + b"\x0a\x03GET\x1a\x01/" + b"\x18\x00",
        id="http_header_content_length_0",
    ),
    pytest.param(
        GREQ.Header(content_length=-1),
        b"\x18" + b"\xff" * 9 + b"\x01",  # int64 -1 is a ten-byte varint
        id="content_length_minus_1",
    ),
    pytest.param(GREQ(upgradeData=GREQ.UpgradeData(data=b"z")), b"\x22\x03\x0a\x01z", id="upgrade_data"),
    pytest.param(
        GRESP(header=GRESP.Header(response=prototool_pb2.HttpResponse(status_code=200))),
        b"\x0a\x05\x0a\x03\x08\xc8\x01",  # 200 = varint c8 01
        id="http_response_status",
    ),
    pytest.param(agent_tracker_rpc.GetConnectedAgentsRequest(project_id=1), b"\x08\x01", id="by_project"),
    pytest.param(agent_tracker_rpc.GetConnectedAgentsRequest(agent_id=7), b"\x10\x07", id="by_agent"),
    pytest.param(
        agent_tracker_pb2.ConnectedAgentInfo(connection_id=1, agent_id=2, project_id=3),
        b"\x18\x01\x20\x02\x28\x03",
        id="connected_agent_ids",
    ),
    pytest.param(
        agent_configuration_rpc.ConfigurationRequest(commit_id="c", skip_register=True),
        b"\x0a\x01c\x18\x01",
        id="configuration_request",
    ),
    pytest.param(
        kubernetes_api_rpc.HeaderExtra(
            imp_config=kubernetes_api_rpc.ImpersonationConfig(
                username="u", extra=[kubernetes_api_rpc.ExtraKeyVal(key="k", val=["v"])]
            )
        ),
        b"\x0a\x0b" + b"\x0a\x01u" + b"\x22\x06" + b"\x0a\x01k\x12\x01v",
        id="header_extra",
    ),
]


@pytest.mark.parametrize(("msg", "expected"), HAND_ENCODED)
def test_hand_computed_bytes(msg: Message, expected: bytes) -> None:
    assert msg.SerializeToString(deterministic=True) == expected
    assert type(msg).FromString(expected) == msg


def test_expiring_value_timestamp_from_hand_bytes() -> None:
    # What another kas writes into the tunnel tracker hash: expires_at = 5, value = "x".
    assert redistool_pb2.ExpiringValueTimestamp.FromString(b"\x08\x05\x12\x01x").expires_at == 5
