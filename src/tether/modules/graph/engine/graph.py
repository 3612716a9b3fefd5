"""The graph agentk maintains for one watch: vertices, arcs, and what changed since the last message.

Per object only what the graph needs is kept (issue 6 item 8): labels (for label-selector arcs), the
outgoing references, the selectors it holds, whether it is a root, and the projection the client asked for
(``o`` or ``j`` already encoded as JSON, None for Secrets). Arcs are keyed by ``(source, destination,
type)`` so several references of one type between the same two vertices are one arc (seed 002 "Types of
arcs"); an arc may point to a vertex that does not exist (yet): it stays, and is sent with ``e``.

Every mutation records what the client may need to hear about in :class:`Changes`: dirty vertices, dirty
arcs, and whether the topology (vertices, arcs, roots) changed, which is what root visibility depends on.
A slow client therefore never makes memory grow beyond the graph itself: changes to one vertex or arc
coalesce into one dirty entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.modules.graph.engine.model import (
    ARC_OWNER,
    ARC_REFERENCE,
    ARC_TRANSITIVE,
    ATTR_MASK,
    ArcKey,
    SelectorRef,
    VertexId,
)

__all__ = ["Changes", "Graph", "Node"]

#: Arc origin bits, next to the attribute bits in :attr:`Graph.arcs` values.
ORIGIN_REFERENCE = 1 << 8
ORIGIN_SELECTOR = 1 << 9
_ORIGINS = ORIGIN_REFERENCE | ORIGIN_SELECTOR

_EMPTY_LABELS: Mapping[str, str] = {}
ARC_TYPES = (ARC_OWNER, ARC_REFERENCE, ARC_TRANSITIVE)


class Node:
    """What is kept of one object.

    Attributes:
        labels: ``metadata.labels``.
        refs: ``(destination, arc type) -> attribute bits`` from the object's fields.
        selectors: label selectors the object holds (e.g. a Service's ``spec.selector``).
        root: a root expression selected the object.
        object: encoded ``o`` or None.
        json_path: encoded ``j`` or None.
        selected: ``(destination, arc type)`` currently matched by ``selectors`` (maintained by the graph).
    """

    __slots__ = ("json_path", "labels", "object", "refs", "root", "selected", "selectors")

    def __init__(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        refs: dict[tuple[VertexId, str], int] | None = None,
        selectors: tuple[SelectorRef, ...] = (),
        root: bool = False,
        object: bytes | None = None,
        json_path: bytes | None = None,
    ) -> None:
        self.labels: Mapping[str, str] = labels or _EMPTY_LABELS
        self.refs: dict[tuple[VertexId, str], int] = refs or {}
        self.selectors = selectors
        self.root = root
        self.object = object
        self.json_path = json_path
        self.selected: dict[tuple[VertexId, str], int] = {}


@dataclass
class Changes:
    """What changed since the client was last updated.

    Attributes:
        vertices: vertices whose presence, projection or visibility may have changed (ordered set).
        arcs: arcs whose presence or attributes may have changed (ordered set).
        topology: vertices, arcs or roots changed (root visibility must be recomputed).
    """

    vertices: dict[VertexId, None] = field(default_factory=dict)
    arcs: dict[ArcKey, None] = field(default_factory=dict)
    topology: bool = False

    def __bool__(self) -> bool:
        return bool(self.vertices or self.arcs or self.topology)


class Graph:
    """Vertices and arcs of one watch, with change tracking."""

    def __init__(self) -> None:
        self.nodes: dict[VertexId, Node] = {}
        #: ``(source, destination, type) -> attribute bits | origin bits``.
        self.arcs: dict[ArcKey, int] = {}
        #: Arcs by destination (destinations may be absent).
        self.into: dict[VertexId, set[ArcKey]] = {}
        #: Root vertices.
        self.roots: set[VertexId] = set()
        self.changes = Changes()
        self._by_collection: dict[tuple[str, str, str], set[VertexId]] = {}
        #: Vertices by ``(group, resource, namespace, label key, label value)``.
        self._by_label: dict[tuple[str, str, str, str, str], set[VertexId]] = {}
        #: Selector holders by the equality label their selector requires, or by collection when it requires none.
        self._holders_by_label: dict[tuple[str, str, str, str, str], set[VertexId]] = {}
        self._holders_any: dict[tuple[str, str, str], set[VertexId]] = {}

    def __contains__(self, vertex: object) -> bool:
        return vertex in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def out_arcs(self, vertex: VertexId) -> Iterable[ArcKey]:
        """Arcs whose source is ``vertex`` (empty when the vertex is absent)."""
        node = self.nodes.get(vertex)
        if node is None:
            return ()
        keys = [(vertex, dst, arc_type) for dst, arc_type in node.refs]
        keys.extend((vertex, dst, arc_type) for dst, arc_type in node.selected if (dst, arc_type) not in node.refs)
        return keys

    def upsert(self, vertex: VertexId, node: Node) -> None:
        """Add or replace the vertex ``vertex`` with ``node`` (``node.selected`` is computed here)."""
        old = self.nodes.get(vertex)
        self.nodes[vertex] = node
        changes = self.changes
        collection = (vertex.group, vertex.resource, vertex.namespace)
        if old is None:
            self._by_collection.setdefault(collection, set()).add(vertex)
            changes.vertices[vertex] = None
            changes.topology = True
            for arc in self.into.get(vertex, ()):
                changes.arcs[arc] = None  # "e" goes away
            old_refs: dict[tuple[VertexId, str], int] = {}
            old_selected: dict[tuple[VertexId, str], int] = {}
        else:
            if old.object != node.object or old.json_path != node.json_path:
                changes.vertices[vertex] = None
            old_refs, old_selected = old.refs, old.selected
        if node.root != (old.root if old is not None else False):
            changes.topology = True
        if node.root:
            self.roots.add(vertex)
        else:
            self.roots.discard(vertex)
        if old_refs != node.refs:
            self._diff(vertex, old_refs, node.refs, ORIGIN_REFERENCE)
        if old is None or old.selectors != node.selectors:
            if old is not None:
                self._unregister(vertex, old.selectors)
            self._register(vertex, node.selectors)
            node.selected = self._match(node.selectors)
        else:
            node.selected = old.selected
        if old_selected != node.selected:
            self._diff(vertex, old_selected, node.selected, ORIGIN_SELECTOR)
        if old is None or old.labels != node.labels:
            if old is not None:
                self._unindex_labels(vertex, old.labels)
            self._index_labels(vertex, node.labels)
            self._reselect(vertex, node.labels)

    def remove(self, vertex: VertexId) -> None:
        """Remove the vertex; its outgoing arcs go, arcs pointing to it stay (now with ``e``)."""
        node = self.nodes.pop(vertex, None)
        if node is None:
            return
        changes = self.changes
        collection = (vertex.group, vertex.resource, vertex.namespace)
        members = self._by_collection.get(collection)
        if members is not None:
            members.discard(vertex)
            if not members:
                del self._by_collection[collection]
        self.roots.discard(vertex)
        self._unindex_labels(vertex, node.labels)
        changes.vertices[vertex] = None
        changes.topology = True
        self._diff(vertex, node.refs, {}, ORIGIN_REFERENCE)
        self._diff(vertex, node.selected, {}, ORIGIN_SELECTOR)
        self._unregister(vertex, node.selectors)
        for holder, _, arc_type in self._selecting(vertex):
            del self.nodes[holder].selected[(vertex, arc_type)]
            self._unset(holder, vertex, arc_type, ORIGIN_SELECTOR)
        for arc in self.into.get(vertex, ()):
            changes.arcs[arc] = None  # now "e"

    # ---- arcs ----

    def _diff(
        self, source: VertexId, old: dict[tuple[VertexId, str], int], new: dict[tuple[VertexId, str], int], origin: int
    ) -> None:
        for key in old:
            if key not in new:
                self._unset(source, key[0], key[1], origin)
        for key, attrs in new.items():
            if old.get(key) != attrs or key not in old:
                self._set(source, key[0], key[1], attrs, origin)

    def _set(self, source: VertexId, destination: VertexId, arc_type: str, attrs: int, origin: int) -> None:
        key = (source, destination, arc_type)
        bits = self.arcs.get(key)
        if bits is None:
            self.into.setdefault(destination, set()).add(key)
            self.changes.topology = True
            bits = 0
        # A reference carries the c/b attributes; a selector match only adds its origin.
        new_bits = ((bits & ~ATTR_MASK) | (attrs & ATTR_MASK) | origin) if origin == ORIGIN_REFERENCE else bits | origin
        if new_bits != bits:
            self.arcs[key] = new_bits
            if (new_bits & ATTR_MASK) != (bits & ATTR_MASK) or not bits:
                self.changes.arcs[key] = None

    def _unset(self, source: VertexId, destination: VertexId, arc_type: str, origin: int) -> None:
        key = (source, destination, arc_type)
        bits = self.arcs.get(key)
        if bits is None:
            return
        bits &= ~origin
        if origin == ORIGIN_REFERENCE:
            bits &= ~ATTR_MASK
        if bits & _ORIGINS:
            self.arcs[key] = bits
        else:
            del self.arcs[key]
            targets = self.into.get(destination)
            if targets is not None:
                targets.discard(key)
                if not targets:
                    del self.into[destination]
            self.changes.topology = True
        self.changes.arcs[key] = None

    # ---- label selectors ----

    def _selecting(self, vertex: VertexId) -> list[ArcKey]:
        """Arcs into ``vertex`` that exist because a selector matched it."""
        return [arc for arc in self.into.get(vertex, ()) if self.arcs.get(arc, 0) & ORIGIN_SELECTOR]

    def _index_labels(self, vertex: VertexId, labels: Mapping[str, str]) -> None:
        g, r, ns = vertex.group, vertex.resource, vertex.namespace
        for key, value in labels.items():
            self._by_label.setdefault((g, r, ns, key, value), set()).add(vertex)

    def _unindex_labels(self, vertex: VertexId, labels: Mapping[str, str]) -> None:
        g, r, ns = vertex.group, vertex.resource, vertex.namespace
        for key, value in labels.items():
            index_key = (g, r, ns, key, value)
            members = self._by_label.get(index_key)
            if members is not None:
                members.discard(vertex)
                if not members:
                    del self._by_label[index_key]

    def _register(self, vertex: VertexId, selectors: tuple[SelectorRef, ...]) -> None:
        for selector in selectors:
            pair = selector.selector.equality_pair()
            if pair is None:
                self._holders_any.setdefault((selector.group, selector.resource, selector.namespace), set()).add(vertex)
            else:
                key = (selector.group, selector.resource, selector.namespace, *pair)
                self._holders_by_label.setdefault(key, set()).add(vertex)

    def _unregister(self, vertex: VertexId, selectors: tuple[SelectorRef, ...]) -> None:
        for selector in selectors:
            pair = selector.selector.equality_pair()
            table: dict[Any, set[VertexId]] = self._holders_any if pair is None else self._holders_by_label
            key: tuple[str, ...] = (selector.group, selector.resource, selector.namespace, *(pair or ()))
            holders = table.get(key)
            if holders is not None:
                holders.discard(vertex)
                if not holders:
                    del table[key]

    def _match(self, selectors: tuple[SelectorRef, ...]) -> dict[tuple[VertexId, str], int]:
        selected: dict[tuple[VertexId, str], int] = {}
        for selector in selectors:
            pair = selector.selector.equality_pair()
            candidates = (
                self._by_collection.get((selector.group, selector.resource, selector.namespace), ())
                if pair is None
                else self._by_label.get((selector.group, selector.resource, selector.namespace, *pair), ())
            )
            for candidate in candidates:
                if selector.selector.matches(self.nodes[candidate].labels):
                    selected[(candidate, selector.arc_type)] = 0
        return selected

    def _reselect(self, vertex: VertexId, labels: Mapping[str, str]) -> None:
        """Re-evaluate every selector that selects or could select ``vertex`` after its labels changed."""
        g, r, ns = vertex.group, vertex.resource, vertex.namespace
        candidates = set(self._holders_any.get((g, r, ns), ()))
        for key, value in labels.items():
            candidates.update(self._holders_by_label.get((g, r, ns, key, value), ()))
        candidates.update(holder for holder, _, _ in self._selecting(vertex))
        candidates.discard(vertex)  # a vertex's own selectors are evaluated in upsert
        for holder in candidates:
            holder_node = self.nodes[holder]
            wanted: set[str] = set()
            for selector in holder_node.selectors:
                if (
                    selector.group == g
                    and selector.resource == r
                    and selector.namespace == ns
                    and selector.selector.matches(labels)
                ):
                    wanted.add(selector.arc_type)
            current = {arc_type for arc_type in ARC_TYPES if (vertex, arc_type) in holder_node.selected}
            for arc_type in wanted - current:
                holder_node.selected[(vertex, arc_type)] = 0
                self._set(holder, vertex, arc_type, 0, ORIGIN_SELECTOR)
            for arc_type in current - wanted:
                del holder_node.selected[(vertex, arc_type)]
                self._unset(holder, vertex, arc_type, ORIGIN_SELECTOR)
