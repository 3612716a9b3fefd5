"""Graph state, root visibility and the client view (seed 002 "roots", "Set an arc", "Response to client")."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.graph.harness import GraphModel
from tether.kube.selectors import parse_label_selector
from tether.modules.graph.engine.graph import Graph, Node
from tether.modules.graph.engine.model import (
    ATTR_CONTROLLER,
    ATTR_DESTINATION_MISSING,
    DeleteArc,
    DeleteVertex,
    SelectorRef,
    SetArc,
    SetVertex,
    VertexId,
)
from tether.modules.graph.engine.view import ClientView
from tether.modules.graph.engine.visibility import reachable
from tether.modules.graph.rpc.wire import batch_to_json


def v(resource: str, name: str, namespace: str = "ns") -> VertexId:
    return VertexId("", "v1", resource, namespace, name)


POD, CM, RS, DEP, SVC, SECRET = (
    v("pods", "p"),
    v("configmaps", "c"),
    v("replicasets", "rs"),
    v("deployments", "d"),
    v("services", "s"),
    v("secrets", "x"),
)


def node(
    *refs: tuple[VertexId, str, int],
    root: bool = False,
    labels: dict[str, str] | None = None,
    body: bytes = b'{"k":1}',
    selectors: tuple[SelectorRef, ...] = (),
) -> Node:
    return Node(labels=labels, refs={(d, t): a for d, t, a in refs}, root=root, object=body, selectors=selectors)


class Client:
    """Applies the view's actions through the JSON wire format to a client model."""

    def __init__(self, graph: Graph, **view_args: object) -> None:
        self.view = ClientView(graph, **view_args)  # type: ignore[arg-type]
        self.model = GraphModel()

    def sync(self, max_actions: int = 1000) -> list[object]:
        out: list[object] = []
        while self.view.pending():
            actions = self.view.take(max_actions)
            if actions:
                self.model.apply(batch_to_json(actions))
            out.extend(actions)
        return out


def key(vertex: VertexId) -> tuple[str, str, str, str, str]:
    return tuple(vertex)  # type: ignore[return-value]


def test_arc_to_missing_destination_has_e_until_it_appears() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    graph.upsert(POD, node((CM, "r", 0)))
    client.sync()
    assert client.model.arcs[(key(POD), key(CM), "r")] == {"e": True}
    graph.upsert(CM, node())
    actions = client.sync()
    assert client.model.arcs[(key(POD), key(CM), "r")] == {}
    assert [type(a) for a in actions] == [SetVertex, SetArc]  # vertex first, then the updated arc
    graph.remove(CM)
    client.sync()
    assert key(CM) not in client.model.vertices
    assert client.model.arcs[(key(POD), key(CM), "r")] == {"e": True}


def test_removing_a_vertex_removes_its_arcs_first() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    graph.upsert(POD, node((RS, "or", ATTR_CONTROLLER)))
    graph.upsert(RS, node())
    client.sync()
    assert client.model.arcs[(key(POD), key(RS), "or")] == {"c": True}
    graph.remove(POD)
    actions = client.sync()
    assert actions == [DeleteArc(POD, RS, "or"), DeleteVertex(POD)]
    assert not client.model.arcs


def test_attribute_change_updates_the_arc() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    graph.upsert(RS, node())
    graph.upsert(POD, node((RS, "or", 0)))
    client.sync()
    graph.upsert(POD, node((RS, "or", ATTR_CONTROLLER)))
    assert client.sync() == [SetArc(POD, RS, "or", ATTR_CONTROLLER)]  # same projection: no svx


def test_loops_and_cycles() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=True, undirected=frozenset())
    graph.upsert(POD, node((POD, "or", 0), (CM, "r", 0), root=True))
    graph.upsert(CM, node((POD, "r", 0)))
    client.sync()
    assert set(client.model.vertices) == {key(POD), key(CM)}
    assert (key(POD), key(POD), "or") in client.model.arcs
    assert (key(CM), key(POD), "r") in client.model.arcs


def test_roots_directed_and_undirected() -> None:
    # Deployment <-or- ReplicaSet <-or- Pod -r-> ConfigMap ; root = Deployment
    def build(undirected: frozenset[str]) -> Client:
        graph = Graph()
        client = Client(graph, roots_enabled=True, undirected=undirected)
        graph.upsert(DEP, node((SECRET, "r", 0), root=True))
        graph.upsert(RS, node((DEP, "or", ATTR_CONTROLLER)))
        graph.upsert(POD, node((RS, "or", ATTR_CONTROLLER), (CM, "r", 0)))
        graph.upsert(CM, node())
        graph.upsert(SECRET, node())
        client.sync()
        return client

    directed = build(frozenset())
    assert set(directed.model.vertices) == {key(DEP), key(SECRET)}
    assert set(directed.model.arcs) == {(key(DEP), key(SECRET), "r")}
    undirected = build(frozenset({"or"}))
    assert set(undirected.model.vertices) == {key(DEP), key(SECRET), key(RS), key(POD), key(CM)}
    only_r = build(frozenset({"r"}))
    assert set(only_r.model.vertices) == {key(DEP), key(SECRET)}


def test_root_appearing_later_and_disappearing() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=True, undirected=frozenset())
    graph.upsert(POD, node((CM, "r", 0)))
    graph.upsert(CM, node())
    client.sync()
    assert not client.model.vertices
    graph.upsert(POD, node((CM, "r", 0), root=True, body=b'{"x":1}'))
    client.sync()
    assert set(client.model.vertices) == {key(POD), key(CM)} and len(client.model.arcs) == 1
    graph.upsert(POD, node((CM, "r", 0), root=False, body=b'{"x":2}'))
    client.sync()
    assert not client.model.vertices and not client.model.arcs
    graph.upsert(POD, node((CM, "r", 0), root=True))
    client.sync()
    graph.remove(POD)
    client.sync()
    assert not client.model.vertices and not client.model.arcs


def test_root_flag_change_without_payload_change_is_noticed() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=True, undirected=frozenset())
    graph.upsert(POD, Node(json_path=b'["a"]'))
    client.sync()
    graph.upsert(POD, Node(json_path=b'["a"]', root=True))
    client.sync()
    assert key(POD) in client.model.vertices


def test_label_selector_arcs_follow_labels() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    selector = SelectorRef("", "v1", "pods", "ns", parse_label_selector("app=web"), "t")
    p2 = v("pods", "p2")
    graph.upsert(POD, node(labels={"app": "web"}))
    graph.upsert(SVC, node(selectors=(selector,)))
    client.sync()
    assert client.model.arcs == {(key(SVC), key(POD), "t"): {}}
    graph.upsert(p2, node(labels={"app": "web"}))
    client.sync()
    assert (key(SVC), key(p2), "t") in client.model.arcs
    graph.upsert(POD, node(labels={"app": "db"}))
    client.sync()
    assert set(client.model.arcs) == {(key(SVC), key(p2), "t")}
    graph.remove(p2)
    client.sync()
    assert not client.model.arcs
    other = SelectorRef("", "v1", "pods", "ns", parse_label_selector("app=db"), "t")
    graph.upsert(SVC, node(selectors=(other,)))
    client.sync()
    assert set(client.model.arcs) == {(key(SVC), key(POD), "t")}
    graph.remove(SVC)
    client.sync()
    assert not client.model.arcs


def test_selector_arc_merges_with_reference_of_same_type() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    selector = SelectorRef("", "v1", "pods", "ns", parse_label_selector("app=web"), "t")
    graph.upsert(POD, node(labels={"app": "web"}))
    graph.upsert(SVC, node((POD, "t", 0), selectors=(selector,)))
    client.sync()
    assert list(client.model.arcs) == [(key(SVC), key(POD), "t")]
    graph.upsert(POD, node(labels={"app": "x"}))  # selector no longer matches, the reference remains
    client.sync()
    assert list(client.model.arcs) == [(key(SVC), key(POD), "t")]


def test_coalescing_sends_only_the_latest_state() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    for i in range(100):
        graph.upsert(POD, node(body=json.dumps({"i": i}).encode()))
    actions = client.sync()
    assert actions == [SetVertex(POD, b'{"i": 99}', None)]
    graph.upsert(CM, node())
    graph.remove(CM)
    assert client.sync() == []  # never seen, never sent


def test_chunking_keeps_every_change() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False)
    for i in range(250):
        graph.upsert(v("pods", f"p{i}"), node((CM, "r", 0)))
    view = client.view
    first = view.take(max_actions=100)
    assert len(first) == 100
    client.model.apply(batch_to_json(first))
    client.sync(max_actions=100)
    assert len(client.model.vertices) == 250 and len(client.model.arcs) == 250
    big = Graph()
    big_view = ClientView(big, roots_enabled=False)
    for i in range(10):
        big.upsert(v("pods", f"p{i}"), node(body=b'{"x":"' + b"a" * 1000 + b'"}'))
    assert 0 < len(big_view.take(max_actions=100, max_bytes=3000)) < 10


_ops = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "remove"]),
        st.integers(0, 5),
        st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["or", "r", "t"]), st.integers(0, 3)), max_size=3),
        st.booleans(),
        st.integers(0, 2),
    ),
    max_size=30,
)


@settings(max_examples=200)
@given(_ops, st.booleans(), st.sets(st.sampled_from(["or", "r", "t"])), st.integers(1, 7))
def test_client_model_converges_to_the_graph(ops, roots_enabled: bool, undirected: set[str], chunk: int) -> None:  # type: ignore[no-untyped-def]
    graph = Graph()
    client = Client(graph, roots_enabled=roots_enabled, undirected=frozenset(undirected))
    ids = [v("pods", f"p{i}") for i in range(6)]
    for op, index, refs, root, body in ops:
        if op == "remove":
            graph.remove(ids[index])
        else:
            graph.upsert(ids[index], node(*((ids[d], t, a) for d, t, a in refs), root=root, body=b"[%d]" % body))
        if body == 0:
            client.sync(chunk)  # sometimes sync in between
    client.sync(chunk)
    visible = reachable(graph, graph.roots, frozenset(undirected)) if roots_enabled else set(graph.nodes)
    assert set(client.model.vertices) == {key(x) for x in visible}
    expected_arcs = {}
    for (source, destination, arc_type), bits in graph.arcs.items():
        if source in visible:
            attrs = {}
            if bits & ATTR_CONTROLLER:
                attrs["c"] = True
            if bits & 2:
                attrs["b"] = True
            if destination not in graph.nodes:
                attrs["e"] = True
            expected_arcs[(key(source), key(destination), arc_type)] = attrs
    assert client.model.arcs == expected_arcs
    for vertex in visible:
        assert client.model.vertices[key(vertex)]["o"] == json.loads(graph.nodes[vertex].object or b"null")
    assert ATTR_DESTINATION_MISSING == 4


def test_initial_state_sends_an_arc_once_both_ends_are_sent() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False, holding=True)
    graph.upsert(POD, node((CM, "r", 0), (SECRET, "r", 0)))
    assert client.sync() == [SetVertex(POD, b'{"k":1}', None)]  # CM and the Secret are not listed yet
    graph.upsert(CM, node())
    assert client.sync() == [SetVertex(CM, b'{"k":1}', None), SetArc(POD, CM, "r", 0)]
    client.view.release()  # every watch synced: the Secret does not exist
    assert client.sync() == [SetArc(POD, SECRET, "r", ATTR_DESTINATION_MISSING)]
    graph.upsert(RS, node((POD, "or", ATTR_CONTROLLER)))
    assert client.sync() == [SetVertex(RS, b'{"k":1}', None), SetArc(RS, POD, "or", ATTR_CONTROLLER)]


def test_initial_state_arcs_follow_their_vertices_across_messages() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False, holding=True)
    graph.upsert(CM, node())
    graph.upsert(POD, node((CM, "r", 0)))
    graph.upsert(RS, node((CM, "r", 0)))
    first = client.view.take(max_actions=1)
    assert first == [SetVertex(CM, b'{"k":1}', None)]
    client.model.apply(batch_to_json(first))
    second = client.view.take(max_actions=2)
    assert second == [SetVertex(POD, b'{"k":1}', None), SetVertex(RS, b'{"k":1}', None)]
    client.model.apply(batch_to_json(second))
    assert client.sync() == [SetArc(POD, CM, "r", 0), SetArc(RS, CM, "r", 0)]


@settings(max_examples=200)
@given(_ops, st.integers(1, 7), st.integers(0, 30))
def test_held_initial_state_converges_and_never_sends_an_arc_before_its_ends(ops, chunk: int, release_at: int) -> None:  # type: ignore[no-untyped-def]
    graph = Graph()
    client = Client(graph, roots_enabled=False, holding=True)
    ids = [v("pods", f"p{i}") for i in range(6)]
    for step, (op, index, refs, root, body) in enumerate(ops):
        if step == release_at:
            client.view.release()
        if op == "remove":
            graph.remove(ids[index])
        else:
            graph.upsert(ids[index], node(*((ids[d], t, a) for d, t, a in refs), root=root, body=b"[%d]" % body))
        if body == 0:
            for action in client.sync(chunk):
                if isinstance(action, SetArc) and client.view.holding:
                    assert key(action.source) in client.model.vertices
                    assert key(action.destination) in client.model.vertices
                    assert not action.attributes & ATTR_DESTINATION_MISSING
    client.view.release()
    client.sync(chunk)
    assert set(client.model.vertices) == {key(x) for x in graph.nodes}
    expected = {(key(s), key(d), t) for (s, d, t) in graph.arcs}
    assert set(client.model.arcs) == expected


@settings(max_examples=200)
@given(_ops, st.booleans(), st.integers(1, 7))
def test_dropping_sent_payloads_still_delivers_every_change(ops, holding: bool, chunk: int) -> None:  # type: ignore[no-untyped-def]
    graph = Graph()
    client = Client(graph, roots_enabled=False, holding=holding, keep_payloads=False)
    ids = [v("pods", f"p{i}") for i in range(6)]
    last: dict[VertexId, bytes] = {}
    for op, index, refs, _, body in ops:
        if op == "remove":
            graph.remove(ids[index])
            last.pop(ids[index], None)
        else:
            payload = b"[%d]" % body
            graph.upsert(ids[index], node(*((ids[d], t, a) for d, t, a in refs), body=payload))
            last[ids[index]] = payload
        if body == 0:
            client.sync(chunk)
    client.view.release()
    client.sync(chunk)
    assert {k: json.loads(b["o"]) if isinstance(b["o"], str) else b["o"] for k, b in client.model.vertices.items()} == {
        key(x): json.loads(p) for x, p in last.items()
    }
    assert all(n.object is None for n in graph.nodes.values())


def test_a_repeated_object_is_not_sent_again_once_its_payload_is_dropped() -> None:
    graph = Graph()
    client = Client(graph, roots_enabled=False, keep_payloads=False)
    graph.upsert(POD, node(body=b'{"a":1}'))
    assert client.sync() == [SetVertex(POD, b'{"a":1}', None)]
    assert graph.nodes[POD].object is None
    graph.upsert(POD, node(body=b'{"a":1}'))  # e.g. a resync re-delivers it unchanged
    assert client.sync() == [] and graph.nodes[POD].object is None
    graph.upsert(POD, node(body=b'{"a":2}'))
    assert client.sync() == [SetVertex(POD, b'{"a":2}', None)]
