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

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

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
_INTO_LIST_MAX = 8
#: ``Node.selected`` of every node without selectors (only selector holders' dicts are ever modified).
_NOTHING_SELECTED: dict[tuple[VertexId, str], int] = {}
ARC_TYPES = (ARC_OWNER, ARC_REFERENCE, ARC_TRANSITIVE)


class Node:
    """What is kept of one object.

    Attributes:
        labels: ``metadata.labels``.
        refs: ``(destination, arc type) -> attribute bits`` from the object's fields.
        selectors: label selectors the object holds (e.g. a Service's ``spec.selector``).
        root: a root expression selected the object.
        object: encoded ``o`` or None; the view may drop it once sent (``ClientView(keep_payloads=False)``).
        json_path: encoded ``j`` or None; dropped likewise.
        packed: ``object`` and ``json_path`` are zlib-compressed (kept for a long time: with roots).
        digest: hash of ``object`` and ``json_path`` as given, which tells a changed
            projection from a repeated one after the bytes are gone.
        selected: ``(destination, arc type)`` currently matched by ``selectors`` (maintained by the graph).
    """

    __slots__ = ("_refs", "digest", "json_path", "labels", "object", "packed", "root", "selected", "selectors")

    def __init__(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        refs: dict[tuple[VertexId, str], int] | None = None,
        selectors: tuple[SelectorRef, ...] = (),
        root: bool = False,
        object: bytes | None = None,
        json_path: bytes | None = None,
        packed: bool = False,
    ) -> None:
        self.labels: Mapping[str, str] = labels or _EMPTY_LABELS
        #: The graph stores references flat, ``(destination, type, attributes, ...)``: a third of a dict's size.
        self._refs: dict[tuple[VertexId, str], int] | tuple[Any, ...] = refs or ()
        self.selectors = selectors
        self.root = root
        self.object = object
        self.json_path = json_path
        self.packed = packed
        self.digest = hash((object, json_path))
        self.selected: dict[tuple[VertexId, str], int] = _NOTHING_SELECTED

    def payload(self) -> tuple[bytes | None, bytes | None]:
        """``(object, json_path)`` as JSON (decompressed when packed)."""
        if not self.packed:
            return self.object, self.json_path
        return (
            zlib.decompress(self.object) if self.object is not None else None,
            zlib.decompress(self.json_path) if self.json_path is not None else None,
        )

    @property
    def refs(self) -> dict[tuple[VertexId, str], int]:
        """``(destination, arc type) -> attribute bits`` (a new dict once the graph holds the node)."""
        refs = self._refs
        if isinstance(refs, dict):
            return refs
        return {(refs[i], refs[i + 1]): refs[i + 2] for i in range(0, len(refs), 3)}

    def destinations(self) -> Iterable[VertexId]:
        """Destinations of the references (with repeats when several arc types lead to one vertex)."""
        refs = self._refs
        if isinstance(refs, dict):
            return [d for d, _ in refs]
        return refs[::3]

    def compact(self, ids: dict[VertexId, VertexId]) -> None:
        """Store the references flat, with the graph's shared instance of each destination id."""
        refs = self._refs
        if isinstance(refs, dict):
            self._refs = tuple(x for (d, t), a in refs.items() for x in (share(ids, d), t, a))


def share(ids: dict[VertexId, VertexId], vertex: VertexId) -> VertexId:
    """The shared instance of ``vertex`` in ``ids`` (added when new).

    Shared instances are plain tuples: they hash, compare and unpack as the :class:`VertexId` they stand for,
    but CPython's garbage collector stops tracking a tuple of strings (and tuples of such tuples: arc keys,
    flat references), never a named tuple. Full collections then skip most of a large graph instead of
    visiting every id, reference and arc of it (issue 15 profile). Graph code reads them by position.
    """
    shared = ids.get(vertex)
    if shared is None:
        shared = cast(VertexId, tuple(vertex))
        ids[shared] = shared
    return shared


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
        #: Arcs by destination (destinations may be absent); a short list, a set once it grows past
        #: ``_INTO_LIST_MAX`` (most objects are pointed at by one or two arcs, and a set costs 216 bytes).
        self.into: dict[VertexId, list[ArcKey] | set[ArcKey]] = {}
        #: Root vertices.
        self.roots: set[VertexId] = set()
        #: One shared instance of each vertex id in ``nodes`` or ``into``: the many references to one object
        #: (every Pod names its ServiceAccount, ConfigMaps, ReplicaSet) then cost a pointer each, not a copy.
        self._ids: dict[VertexId, VertexId] = {}
        self.changes = Changes()
        self._by_collection: dict[tuple[str, str, str], set[VertexId]] = {}
        #: Vertices by ``(group, resource, namespace, label key, label value)``.
        self._by_label: dict[tuple[str, str, str, str, str], set[VertexId]] = {}
        #: Selector holders by the equality label their selector requires, or by collection when it requires none.
        self._holders_by_label: dict[tuple[str, str, str, str, str], set[VertexId]] = {}
        self._holders_any: dict[tuple[str, str, str], set[VertexId]] = {}
        #: Selectors registered per ``(group, resource, namespace)`` they select in: most collections have none,
        #: and their objects' label changes need no selector work at all.
        self._targeted: dict[tuple[str, str, str], int] = {}

    def __contains__(self, vertex: object) -> bool:
        return vertex in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def out_arcs(self, vertex: VertexId) -> Iterable[ArcKey]:
        """Arcs whose source is ``vertex`` (empty when the vertex is absent)."""
        node = self.nodes.get(vertex)
        if node is None:
            return ()
        refs = node.refs
        keys = [(vertex, dst, arc_type) for dst, arc_type in refs]
        keys.extend((vertex, dst, arc_type) for dst, arc_type in node.selected if (dst, arc_type) not in refs)
        return keys

    def upsert(self, vertex: VertexId, node: Node) -> None:
        """Add or replace the vertex ``vertex`` with ``node`` (``node.selected`` is computed here)."""
        ids = self._ids
        vertex = share(ids, vertex)
        node.compact(ids)
        old = self.nodes.get(vertex)
        self.nodes[vertex] = node
        changes = self.changes
        collection = (vertex[0], vertex[2], vertex[3])
        if old is None:
            self._by_collection.setdefault(collection, set()).add(vertex)
            changes.vertices[vertex] = None
            changes.topology = True
            for arc in self.into.get(vertex, ()):
                changes.arcs[arc] = None  # "e" goes away
            old_refs: dict[tuple[VertexId, str], int] = {}
            old_selected: dict[tuple[VertexId, str], int] = {}
        else:
            if old.digest != node.digest:
                changes.vertices[vertex] = None
            elif vertex not in changes.vertices:
                # Same projection, already with the client: keep only what the view kept of it.
                node.object, node.json_path = old.object, old.json_path
            old_refs, old_selected = old.refs, old.selected
        new_refs = node.refs
        if node.root != (old.root if old is not None else False):
            changes.topology = True
        if node.root:
            self.roots.add(vertex)
        else:
            self.roots.discard(vertex)
        if old_refs != new_refs:
            self._diff(vertex, old_refs, new_refs, ORIGIN_REFERENCE)
        if old is None or old.selectors != node.selectors:
            if old is not None:
                self._unregister(vertex, old.selectors)
            self._register(vertex, node.selectors)
            node.selected = self._match(node.selectors) if node.selectors else _NOTHING_SELECTED
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
        vertex = self._ids[vertex]
        changes = self.changes
        collection = (vertex[0], vertex[2], vertex[3])
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
        if vertex not in self.into:
            self._ids.pop(vertex, None)

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
            targets = self.into.get(destination)
            if targets is None:
                self.into[destination] = [key]
            elif isinstance(targets, set):
                targets.add(key)
            elif len(targets) < _INTO_LIST_MAX:
                targets.append(key)  # a new arc: not in the list yet
            else:
                self.into[destination] = {*targets, key}
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
                if isinstance(targets, set):
                    targets.discard(key)
                elif key in targets:
                    targets.remove(key)
                if not targets:
                    del self.into[destination]
                    if destination not in self.nodes:
                        self._ids.pop(destination, None)
            self.changes.topology = True
        self.changes.arcs[key] = None

    # ---- label selectors ----

    def _selecting(self, vertex: VertexId) -> list[ArcKey]:
        """Arcs into ``vertex`` that exist because a selector matched it."""
        return [arc for arc in self.into.get(vertex, ()) if self.arcs.get(arc, 0) & ORIGIN_SELECTOR]

    def _index_labels(self, vertex: VertexId, labels: Mapping[str, str]) -> None:
        g, _, r, ns, _ = vertex
        for key, value in labels.items():
            self._by_label.setdefault((g, r, ns, key, value), set()).add(vertex)

    def _unindex_labels(self, vertex: VertexId, labels: Mapping[str, str]) -> None:
        g, _, r, ns, _ = vertex
        for key, value in labels.items():
            index_key = (g, r, ns, key, value)
            members = self._by_label.get(index_key)
            if members is not None:
                members.discard(vertex)
                if not members:
                    del self._by_label[index_key]

    def _register(self, vertex: VertexId, selectors: tuple[SelectorRef, ...]) -> None:
        for selector in selectors:
            target = (selector.group, selector.resource, selector.namespace)
            self._targeted[target] = self._targeted.get(target, 0) + 1
            pair = selector.selector.equality_pair()
            if pair is None:
                self._holders_any.setdefault((selector.group, selector.resource, selector.namespace), set()).add(vertex)
            else:
                key = (selector.group, selector.resource, selector.namespace, *pair)
                self._holders_by_label.setdefault(key, set()).add(vertex)

    def _unregister(self, vertex: VertexId, selectors: tuple[SelectorRef, ...]) -> None:
        for selector in selectors:
            target = (selector.group, selector.resource, selector.namespace)
            remaining = self._targeted.get(target, 0) - 1
            if remaining > 0:
                self._targeted[target] = remaining
            else:
                self._targeted.pop(target, None)
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
        g, _, r, ns, _ = vertex
        if (g, r, ns) not in self._targeted:
            return  # no selector looks at this collection, so none can have selected the vertex either
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
