"""Stream automata read from the proto options (kas.md §1.3, §2.3, §5.2) and enforced by StreamAutomaton."""

from __future__ import annotations

from typing import TypeVar

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from tether.pb.gitlab.agent.agent_tracker.rpc.rpc_pb2 import GetConnectedAgentsRequest
from tether.pb.gitlab.agent.automata import automata_pb2
from tether.pb.gitlab.agent.grpctool.grpctool_pb2 import HttpRequest, HttpResponse
from tether.pb.gitlab.agent.kas.kasapp_pb2 import GatewayKasResponse
from tether.pb.gitlab.agent.redistool.redistool_pb2 import ExpiringValue
from tether.pb.gitlab.agent.reverse_tunnel.rpc.rpc_pb2 import ConnectRequest, ConnectResponse
from tether.tool.automaton import EOF, StreamAutomaton, StreamOrderError, eof_allowed_first, stream_rules

M = TypeVar("M", bound=Message)

STREAMED = [ConnectRequest, ConnectResponse, GatewayKasResponse, HttpRequest, HttpResponse]


def make(cls: type[M], field: str) -> M:
    msg = cls()
    getattr(msg, field).SetInParent()
    return msg


def run(cls: type[Message], events: list[str]) -> StreamAutomaton[Message]:
    """Feed field names (or "EOF") to a fresh automaton; return it for inspection."""
    automaton: StreamAutomaton[Message] = StreamAutomaton(cls)
    for event in events:
        if event == "EOF":
            automaton.end()
        else:
            assert automaton.visit(make(cls, event)) == event
    return automaton


# The rules exactly as kas.md states them, so a drifting .proto is caught independently of the runtime.
# GatewayKasResponse tunnel_ready -> error (5) is our deliberate lenient addition (kas.md §2.3 note).
DOCUMENTED_RULES = [
    pytest.param(
        ConnectRequest,
        "msg",
        {1},
        {1: {2, 5}, 2: {3, 4}, 3: {3, 4}, 4: {5, EOF}, 5: {EOF}},
        id="ConnectRequest-1.3",
    ),
    pytest.param(
        ConnectResponse,
        "msg",
        {1, EOF},
        {1: {2, 3, EOF}, 2: {2, 3, EOF}, 3: {EOF}},
        id="ConnectResponse-1.3",
    ),
    pytest.param(
        GatewayKasResponse,
        "msg",
        {1, 6, EOF},
        {1: {2, 5}, 2: {3, 4}, 3: {3, 4}, 4: {5, EOF}, 5: {EOF}, 6: {1, EOF}},
        id="GatewayKasResponse-2.3",
    ),
    pytest.param(
        HttpRequest,
        "message",
        {1},
        {1: {2, 3}, 2: {2, 3}, 3: {4, EOF}, 4: {4, EOF}},
        id="HttpRequest-5.2",
    ),
    pytest.param(
        HttpResponse,
        "message",
        {1},
        {1: {2, 3}, 2: {2, 3}, 3: {4, EOF}, 4: {4, EOF}},
        id="HttpResponse-5.2",
    ),
]


@pytest.mark.parametrize(("cls", "oneof", "first", "transitions"), DOCUMENTED_RULES)
def test_declared_rules_match_reference(
    cls: type[Message], oneof: str, first: set[int], transitions: dict[int, set[int]]
) -> None:
    rules = stream_rules(cls)
    assert rules.oneof_name == oneof
    assert rules.first == first
    assert {k: set(v) for k, v in rules.next.items()} == transitions


ACCEPTED = [
    pytest.param(ConnectRequest, ["descriptor", "header", "message", "message", "trailer", "EOF"], id="tunnel-success"),
    pytest.param(ConnectRequest, ["descriptor", "header", "trailer", "EOF"], id="tunnel-success-no-messages"),
    pytest.param(ConnectRequest, ["descriptor", "header", "message", "trailer", "error", "EOF"], id="tunnel-failure"),
    pytest.param(ConnectRequest, ["descriptor", "error", "EOF"], id="tunnel-descriptor-then-error"),
    pytest.param(ConnectResponse, ["EOF"], id="kas-retires-unused-tunnel"),
    pytest.param(ConnectResponse, ["request_info", "EOF"], id="request-info-then-eof"),
    pytest.param(ConnectResponse, ["request_info", "message", "message", "close_send", "EOF"], id="request-stream"),
    pytest.param(ConnectResponse, ["request_info", "close_send", "EOF"], id="request-no-messages"),
    pytest.param(ConnectResponse, ["request_info", "message", "EOF"], id="request-without-close-send"),
    pytest.param(GatewayKasResponse, ["EOF"], id="gateway-eof-first"),
    pytest.param(GatewayKasResponse, ["no_tunnel", "EOF"], id="gateway-no-tunnel-then-eof"),
    pytest.param(
        GatewayKasResponse,
        ["no_tunnel", "tunnel_ready", "header", "message", "trailer", "EOF"],
        id="gateway-no-tunnel-then-ready",
    ),
    pytest.param(
        GatewayKasResponse, ["tunnel_ready", "header", "trailer", "error", "EOF"], id="gateway-failure-with-trailer"
    ),
    pytest.param(GatewayKasResponse, ["tunnel_ready", "error", "EOF"], id="gateway-lenient-ready-then-error"),
    pytest.param(HttpRequest, ["header", "trailer", "EOF"], id="http-request-no-body"),
    pytest.param(HttpRequest, ["header", "data", "data", "trailer", "EOF"], id="http-request-body"),
    pytest.param(
        HttpRequest, ["header", "trailer", "upgradeData", "upgradeData", "EOF"], id="http-request-upgrade-data"
    ),
    pytest.param(HttpResponse, ["header", "data", "trailer", "EOF"], id="http-response-body"),
    pytest.param(HttpResponse, ["header", "trailer", "upgradeData", "EOF"], id="http-response-upgrade-data"),
]


@pytest.mark.parametrize(("cls", "events"), ACCEPTED)
def test_accepted_sequences(cls: type[Message], events: list[str]) -> None:
    automaton = run(cls, events)
    assert automaton.ended
    assert automaton.allowed == frozenset()


REJECTED = [
    pytest.param(
        ConnectRequest,
        ["header"],
        "ConnectRequest: got 'header' (2) as the first message; allowed: descriptor (1)",
        id="first-not-descriptor",
    ),
    pytest.param(
        ConnectRequest,
        ["descriptor", "message"],
        "ConnectRequest: got 'message' (3) after 'descriptor' (1); allowed: header (2), error (5)",
        id="message-before-header",
    ),
    pytest.param(
        ConnectRequest,
        ["descriptor", "descriptor"],
        "ConnectRequest: got 'descriptor' (1) after 'descriptor' (1); allowed: header (2), error (5)",
        id="descriptor-twice",
    ),
    pytest.param(
        ConnectRequest,
        ["descriptor", "error", "message"],
        "ConnectRequest: got 'message' (3) after 'error' (5); allowed: EOF",
        id="message-after-error",
    ),
    pytest.param(
        ConnectRequest,
        ["descriptor", "header", "trailer", "message"],
        "ConnectRequest: got 'message' (3) after 'trailer' (4); allowed: error (5), EOF",
        id="message-after-trailer",
    ),
    pytest.param(
        ConnectRequest,
        ["descriptor", "header", "EOF"],
        "ConnectRequest: stream ended after 'header' (2); expected message (3), trailer (4)",
        id="eof-after-header",
    ),
    pytest.param(
        ConnectRequest,
        ["descriptor", "EOF"],
        "ConnectRequest: stream ended after 'descriptor' (1); expected header (2), error (5)",
        id="eof-after-descriptor",
    ),
    pytest.param(
        ConnectRequest,
        ["EOF"],
        "ConnectRequest: stream ended before the first message; expected descriptor (1)",
        id="eof-before-descriptor",
    ),
    pytest.param(
        ConnectResponse,
        ["message"],
        "ConnectResponse: got 'message' (2) as the first message; allowed: request_info (1), EOF",
        id="response-first-not-request-info",
    ),
    pytest.param(
        ConnectResponse,
        ["request_info", "request_info"],
        "ConnectResponse: got 'request_info' (1) after 'request_info' (1); allowed: message (2), close_send (3), EOF",
        id="request-info-twice",
    ),
    pytest.param(
        ConnectResponse,
        ["request_info", "close_send", "message"],
        "ConnectResponse: got 'message' (2) after 'close_send' (3); allowed: EOF",
        id="message-after-close-send",
    ),
    pytest.param(
        GatewayKasResponse,
        ["header"],
        "GatewayKasResponse: got 'header' (2) as the first message; allowed: tunnel_ready (1), no_tunnel (6), EOF",
        id="gateway-header-first",
    ),
    pytest.param(
        GatewayKasResponse,
        ["no_tunnel", "no_tunnel"],
        "GatewayKasResponse: got 'no_tunnel' (6) after 'no_tunnel' (6); allowed: tunnel_ready (1), EOF",
        id="gateway-no-tunnel-twice",
    ),
    pytest.param(
        GatewayKasResponse,
        ["tunnel_ready", "message"],
        "GatewayKasResponse: got 'message' (3) after 'tunnel_ready' (1); allowed: header (2), error (5)",
        id="gateway-message-before-header",
    ),
    pytest.param(
        GatewayKasResponse,
        ["tunnel_ready", "EOF"],
        "GatewayKasResponse: stream ended after 'tunnel_ready' (1); expected header (2), error (5)",
        id="gateway-eof-after-ready",
    ),
    pytest.param(
        HttpRequest,
        ["data"],
        "HttpRequest: got 'data' (2) as the first message; allowed: header (1)",
        id="http-data-first",
    ),
    pytest.param(
        HttpRequest,
        ["header", "upgradeData"],
        "HttpRequest: got 'upgradeData' (4) after 'header' (1); allowed: data (2), trailer (3)",
        id="http-upgrade-before-trailer",
    ),
    pytest.param(
        HttpRequest,
        ["header", "trailer", "upgradeData", "data"],
        "HttpRequest: got 'data' (2) after 'upgradeData' (4); allowed: upgradeData (4), EOF",
        id="http-body-after-upgrade",
    ),
    pytest.param(
        HttpResponse,
        ["header", "data", "EOF"],
        "HttpResponse: stream ended after 'data' (2); expected data (2), trailer (3)",
        id="http-eof-inside-body",
    ),
    pytest.param(
        HttpResponse,
        ["EOF"],
        "HttpResponse: stream ended before the first message; expected header (1)",
        id="http-response-empty-stream",
    ),
]


@pytest.mark.parametrize(("cls", "events", "error"), REJECTED)
def test_rejected_sequences(cls: type[Message], events: list[str], error: str) -> None:
    with pytest.raises(StreamOrderError) as excinfo:
        run(cls, events)
    assert str(excinfo.value) == error


@pytest.mark.parametrize(
    ("cls", "error"),
    [
        (ConnectRequest, "ConnectRequest: no oneof field set in 'msg'"),
        (ConnectResponse, "ConnectResponse: no oneof field set in 'msg'"),
        (GatewayKasResponse, "GatewayKasResponse: no oneof field set in 'msg'"),
        (HttpRequest, "HttpRequest: no oneof field set in 'message'"),
        (HttpResponse, "HttpResponse: no oneof field set in 'message'"),
    ],
)
def test_empty_oneof_rejected(cls: type[Message], error: str) -> None:
    automaton: StreamAutomaton[Message] = StreamAutomaton(cls)
    with pytest.raises(StreamOrderError) as excinfo:
        automaton.visit(cls())
    assert str(excinfo.value) == error
    assert automaton.last is None


def test_stream_order_error_is_value_error() -> None:
    assert issubclass(StreamOrderError, ValueError)


@pytest.mark.parametrize(
    ("cls", "allowed"),
    [(ConnectRequest, False), (ConnectResponse, True), (GatewayKasResponse, True), (HttpRequest, False)],
)
def test_eof_allowed_first(cls: type[Message], allowed: bool) -> None:
    assert eof_allowed_first(cls) is allowed
    assert StreamAutomaton(cls).eof_allowed is allowed


def test_rejected_message_keeps_state() -> None:
    automaton = StreamAutomaton(ConnectRequest)
    automaton.visit(make(ConnectRequest, "descriptor"))
    with pytest.raises(StreamOrderError):
        automaton.visit(make(ConnectRequest, "trailer"))
    assert automaton.last == "descriptor"
    assert automaton.visit(make(ConnectRequest, "header")) == "header"
    assert automaton.allowed == {3, 4}
    assert not automaton.eof_allowed


def test_no_message_after_end() -> None:
    automaton = run(ConnectResponse, ["request_info", "EOF"])
    with pytest.raises(StreamOrderError) as excinfo:
        automaton.visit(make(ConnectResponse, "message"))
    assert str(excinfo.value) == "ConnectResponse: got 'message' (2) after the end of the stream"
    with pytest.raises(StreamOrderError, match="ended twice"):
        automaton.end()


def test_start_after_descriptor() -> None:
    # kas consumes the descriptor when registering the tunnel and relays the rest (kas.md §1.7).
    automaton = StreamAutomaton(ConnectRequest, after="descriptor")
    assert automaton.last == "descriptor"
    assert automaton.visit(make(ConnectRequest, "error")) == "error"
    automaton.end()
    with pytest.raises(KeyError):
        StreamAutomaton(ConnectRequest, after="nonexistent")


def test_wrong_message_type() -> None:
    automaton = StreamAutomaton(ConnectRequest)
    with pytest.raises(TypeError, match=r"expected gitlab\.agent\.reverse_tunnel\.rpc\.ConnectRequest"):
        automaton.visit(make(ConnectResponse, "request_info"))  # type: ignore[arg-type]


def test_rules_describe_and_lookup() -> None:
    rules = StreamAutomaton(GatewayKasResponse).rules
    assert rules.full_name == "gitlab.agent.kas.GatewayKasResponse"
    assert rules.field_number("no_tunnel") == 6
    assert rules.describe(frozenset({EOF, 6, 1})) == "tunnel_ready (1), no_tunnel (6), EOF"
    assert rules.describe(frozenset()) == "nothing"
    with pytest.raises(KeyError):
        rules.field_number("nope")


@pytest.mark.parametrize(
    ("cls", "oneof", "error"),
    [
        (ExpiringValue, None, "expected exactly one oneof with first_allowed_field, found none"),
        (GetConnectedAgentsRequest, None, "expected exactly one oneof with first_allowed_field, found none"),
        (GetConnectedAgentsRequest, "request", "declares no first_allowed_field"),
        (ConnectRequest, "nope", "has no oneof 'nope'"),
    ],
)
def test_message_without_automaton(cls: type[Message], oneof: str | None, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        StreamAutomaton(cls, oneof)


def _synthetic(name: str, oneofs: list[tuple[list[int], list[list[int]]]]) -> type[Message]:
    """Build a message class with one oneof per (first_allowed_field, [next_allowed_field per field])."""
    pool = descriptor_pool.DescriptorPool()
    for dep in (descriptor_pb2.DESCRIPTOR, automata_pb2.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        dep.CopyToProto(proto)
        pool.Add(proto)
    file = descriptor_pb2.FileDescriptorProto(
        name="synthetic.proto", package="synthetic", syntax="proto3", dependency=[automata_pb2.DESCRIPTOR.name]
    )
    msg = file.message_type.add(name=name)
    msg.nested_type.add(name="Empty")
    number = 0
    for index, (first, nexts) in enumerate(oneofs):
        oneof = msg.oneof_decl.add(name=f"o{index}")
        oneof.options.Extensions[automata_pb2.first_allowed_field].extend(first)
        for allowed in nexts:
            number += 1
            field = msg.field.add(
                name=f"f{number}",
                number=number,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                type_name=f".synthetic.{name}.Empty",
                oneof_index=index,
            )
            field.options.Extensions[automata_pb2.next_allowed_field].extend(allowed)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"synthetic.{name}"))


@pytest.mark.parametrize(
    ("name", "oneofs", "error"),
    [
        ("NoNext", [([1], [[2], []])], "synthetic.NoNext.f2 declares no next_allowed_field"),
        ("UnknownNext", [([1], [[7], [EOF]])], r"f1 refers to unknown field numbers \[7\]"),
        ("UnknownFirst", [([3], [[EOF]])], r"first_allowed_field refers to unknown field numbers \[3\]"),
        ("TwoOneofs", [([1], [[EOF]]), ([2], [[EOF]])], "found o0, o1; pass the oneof name explicitly"),
    ],
)
def test_malformed_declarations_fail_fast(
    name: str, oneofs: list[tuple[list[int], list[list[int]]]], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        stream_rules(_synthetic(name, oneofs))


def test_two_oneofs_with_explicit_name() -> None:
    cls = _synthetic("Explicit", [([1], [[EOF]]), ([2], [[2, EOF]])])
    automaton: StreamAutomaton[Message] = StreamAutomaton(cls, "o1")
    assert automaton.visit(make(cls, "f2")) == "f2"
    assert automaton.visit(make(cls, "f2")) == "f2"
    automaton.end()


@pytest.mark.parametrize("cls", STREAMED)
def test_every_field_reachable(cls: type[Message]) -> None:
    # A field no transition can reach would be dead protocol surface; catches typos in option numbers.
    rules = stream_rules(cls)
    reachable = set(rules.first)
    for targets in rules.next.values():
        reachable |= targets
    assert set(rules.field_names) <= reachable
