"""Root visibility (seed 002 "roots"): which vertices a root reaches through arcs.

"Object is only made visible to the client if it has a direct or transitive inbound arc from a root":
starting from every root, follow arcs from source to destination; for the arc types listed in
``roots.ignore_arc_direction`` also follow them from destination to source. Roots are visible themselves.
Arcs to absent vertices lead nowhere. Without root expressions every vertex is visible (the caller does
not use this module then).
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.modules.graph.engine.graph import Graph
from tether.modules.graph.engine.model import VertexId

__all__ = ["reachable"]


def reachable(graph: Graph, roots: Iterable[VertexId], undirected: frozenset[str]) -> set[VertexId]:
    """Vertices reachable from ``roots`` (roots included).

    Args:
        graph: the graph.
        roots: start vertices (absent ones are ignored).
        undirected: arc types that may also be followed from destination to source.
    """
    nodes = graph.nodes
    visible = {root for root in roots if root in nodes}
    stack = list(visible)
    into = graph.into
    while stack:
        vertex = stack.pop()
        node = nodes[vertex]
        for destination in node.destinations():
            if destination not in visible and destination in nodes:
                visible.add(destination)
                stack.append(destination)
        for destination, _ in node.selected:
            if destination not in visible and destination in nodes:
                visible.add(destination)
                stack.append(destination)
        if undirected:
            for source, _, arc_type in into.get(vertex, ()):
                if arc_type in undirected and source not in visible:
                    # Sources always exist: arcs are removed with their source.
                    visible.add(source)
                    stack.append(source)
    return visible
