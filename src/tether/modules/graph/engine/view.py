"""What the client has been told, and the actions that bring it up to date (seed 002 "Response to client").

The view remembers the vertices and arcs (with attributes) it has sent. :meth:`ClientView.take` turns
the graph's dirty entries into actions, at most ``max_actions`` / about ``max_bytes`` per call, so a large
initial graph goes out as several messages and a slow client gets the latest state of each vertex and arc
instead of every intermediate one. Within one message the order is ``darc``, ``dvx``, ``svx``, ``sarc``:
arcs leave before their vertices, vertices arrive before the arcs that point at them.

Visibility: without roots every vertex in the graph is visible; with roots, see ``visibility.py``. An arc
is sent when its source is visible (its destination then is visible or absent, in which case ``e`` is
set: "When an arc's destination vertex does not exist ... ``e`` is set to ``true``").

Initial state (issue 15): while :attr:`ClientView.holding` is set (the engine's watches have not all synced
yet), an arc is sent as soon as both of its ends have been sent; until then it is held under the end that
is missing, and it is queued again when that end's ``svx`` leaves. :meth:`ClientView.release` (every watch
synced) queues every held arc: a destination still missing then really is absent and the arc goes with
``e``. So a client can draw while the rest of the graph arrives, and never sees a transient ``e`` for a
destination that was merely listed later.
"""

from __future__ import annotations

from itertools import islice

from tether.modules.graph.engine.graph import Graph
from tether.modules.graph.engine.model import (
    ATTR_DESTINATION_MISSING,
    ATTR_MASK,
    Action,
    ArcKey,
    DeleteArc,
    DeleteVertex,
    SetArc,
    SetVertex,
    VertexId,
)
from tether.modules.graph.engine.visibility import reachable

__all__ = ["ClientView"]


def _public(vertex: VertexId) -> VertexId:
    """A :class:`VertexId` for an action (the graph shares plain tuples, see ``graph.share``)."""
    return tuple.__new__(VertexId, vertex)


#: Rough encoded size of an action without payload, in bytes (for message size budgeting).
_ACTION_OVERHEAD = 160


class ClientView:
    """The client's copy of the graph.

    Args:
        graph: the graph to follow.
        roots_enabled: root filtering applies (``roots.object_selector_expressions`` non-empty).
        undirected: arc types whose direction is ignored for reachability.
        holding: start by holding arcs until both ends are sent (initial state, see the module doc).
        keep_payloads: keep a vertex's ``o`` / ``j`` bytes after sending them. Needed when visibility can
            change (roots), since a vertex may have to be sent again without a new object; otherwise the
            bytes are dropped once sent (a changed object brings new ones) and only their digest stays.
    """

    def __init__(
        self,
        graph: Graph,
        *,
        roots_enabled: bool,
        undirected: frozenset[str] = frozenset(),
        holding: bool = False,
        keep_payloads: bool = True,
    ) -> None:
        self._graph = graph
        self._roots_enabled = roots_enabled
        self._undirected = undirected
        self._visible: set[VertexId] = set()
        self.sent_vertices: set[VertexId] = set()
        self.sent_arcs: dict[ArcKey, int] = {}
        #: Hold arcs until both ends are sent (initial state); see the module doc.
        self.holding = holding
        self._held: dict[VertexId, list[ArcKey]] = {}
        self._keep_payloads = keep_payloads

    def release(self) -> None:
        """Stop holding arcs: queue every held arc (their missing ends are absent, they go with ``e``)."""
        self.holding = False
        arcs = self._graph.changes.arcs
        for held in self._held.values():
            for key in held:
                arcs[key] = None
        self._held = {}

    def pending(self) -> bool:
        """True when there may be actions to send."""
        return bool(self._graph.changes)

    def is_visible(self, vertex: VertexId) -> bool:
        """Whether ``vertex`` exists and is visible (as of the last :meth:`take`)."""
        if not self._roots_enabled:
            return vertex in self._graph.nodes
        return vertex in self._visible

    def take(self, max_actions: int = 1000, max_bytes: int = 1 << 20) -> list[Action]:
        """Actions for up to ``max_actions`` dirty entries (fewer when ``max_bytes`` is reached).

        Args:
            max_actions: upper bound on dirty entries processed (each yields at most one action).
            max_bytes: approximate upper bound on the encoded size of the actions.
        """
        graph = self._graph
        changes = graph.changes
        if self._roots_enabled and changes.topology:
            self._recompute_visibility()
        changes.topology = False
        delete_arcs: list[Action] = []
        delete_vertices: list[Action] = []
        set_vertices: list[Action] = []
        set_arcs: list[Action] = []
        budget = max_bytes
        processed = 0
        done_vertices: list[VertexId] = []
        for vertex in islice(changes.vertices, max_actions):
            if budget <= 0:
                break
            done_vertices.append(vertex)
            processed += 1
            node = graph.nodes.get(vertex)
            if node is not None and self.is_visible(vertex):
                encoded_object, encoded_json_path = node.payload()
                set_vertices.append(SetVertex(_public(vertex), encoded_object, encoded_json_path))
                self.sent_vertices.add(vertex)
                budget -= _ACTION_OVERHEAD + len(encoded_object or encoded_json_path or b"")
                if not self._keep_payloads:
                    node.object = node.json_path = None
                held = self._held.pop(vertex, None)
                if held is not None:
                    for key in held:
                        changes.arcs[key] = None
            elif vertex in self.sent_vertices:
                self.sent_vertices.discard(vertex)
                delete_vertices.append(DeleteVertex(_public(vertex)))
                budget -= _ACTION_OVERHEAD
        for vertex in done_vertices:
            del changes.vertices[vertex]
        if not changes.vertices:
            changes.vertices = {}  # a drained dict keeps its peak-sized table
        done_arcs: list[ArcKey] = []
        for key in islice(changes.arcs, max(0, max_actions - processed)):
            if budget <= 0:
                break
            done_arcs.append(key)
            source, destination, arc_type = key
            bits = graph.arcs.get(key)
            if bits is not None and self.is_visible(source):
                if self.holding:
                    missing = (
                        source
                        if source not in self.sent_vertices
                        else destination
                        if destination not in self.sent_vertices
                        else None
                    )
                    if missing is not None:
                        self._held.setdefault(missing, []).append(key)
                        continue
                attrs = bits & ATTR_MASK
                if destination not in graph.nodes:
                    attrs |= ATTR_DESTINATION_MISSING
                if self.sent_arcs.get(key) != attrs:
                    self.sent_arcs[key] = attrs
                    set_arcs.append(SetArc(_public(source), _public(destination), arc_type, attrs))
                    budget -= _ACTION_OVERHEAD * 2
            elif self.sent_arcs.pop(key, None) is not None:
                delete_arcs.append(DeleteArc(_public(source), _public(destination), arc_type))
                budget -= _ACTION_OVERHEAD * 2
        for key in done_arcs:
            del changes.arcs[key]
        if not changes.arcs:
            changes.arcs = {}
        return delete_arcs + delete_vertices + set_vertices + set_arcs

    def _recompute_visibility(self) -> None:
        graph = self._graph
        visible = reachable(graph, graph.roots, self._undirected)
        changed = visible ^ self._visible
        self._visible = visible
        for vertex in changed:
            graph.changes.vertices[vertex] = None
            for arc in graph.out_arcs(vertex):
                graph.changes.arcs[arc] = None
