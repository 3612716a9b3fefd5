"""Graph vocabulary shared by the Graph API modules: vertex ids, arc keys and attribute bits.

Seed 002 "Types of arcs": a vertex is identified by group, version, resource, namespace ("" for
cluster-scoped objects) and name; an arc by its source, destination and type (``or``, ``r``, ``t``), so
references of one type between the same two vertices are one arc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tether.kube.selectors import LabelSelector

__all__ = [
    "ARC_OWNER",
    "ARC_REFERENCE",
    "ARC_TRANSITIVE",
    "ATTR_BLOCK_OWNER_DELETION",
    "ATTR_CONTROLLER",
    "ATTR_DESTINATION_MISSING",
    "ATTR_MASK",
    "WARNING_DISCOVERY_FAILED",
    "WARNING_INFORMER_SYNC_FAILED",
    "WARNING_INTERNAL_ERROR",
    "WARNING_NAMESPACE_LIST_FAILED",
    "WARNING_OBJECT_PROCESSING_FAILED",
    "Action",
    "ArcKey",
    "DeleteArc",
    "DeleteVertex",
    "GraphWarning",
    "SelectorRef",
    "SetArc",
    "SetVertex",
    "VertexId",
]

#: Arc types (seed 002 "Types of arcs").
ARC_OWNER = "or"
ARC_REFERENCE = "r"
ARC_TRANSITIVE = "t"

#: Arc attribute bits: ``c`` (controller owner reference), ``b`` (blockOwnerDeletion), ``e`` (destination
#: absent or not known yet; computed when the arc is sent).
ATTR_CONTROLLER = 1
ATTR_BLOCK_OWNER_DELETION = 2
ATTR_DESTINATION_MISSING = 4
#: The attribute bits carried by references (``e`` is computed when sending).
ATTR_MASK = ATTR_CONTROLLER | ATTR_BLOCK_OWNER_DELETION


class VertexId(NamedTuple):
    """Identity of a vertex (one Kubernetes object in its watched version)."""

    group: str
    version: str
    resource: str
    namespace: str
    name: str


#: ``(source, destination, type)``.
ArcKey = tuple[VertexId, VertexId, str]


@dataclass(frozen=True, slots=True)
class SelectorRef:
    """A label selector of the source object that selects destination objects (e.g. Service -> Pods).

    Attributes:
        group: destination API group.
        version: destination version (the watched one).
        resource: destination resource.
        namespace: where the selected objects live.
        selector: the label selector.
        arc_type: the type of the arcs to the selected objects.
    """

    group: str
    version: str
    resource: str
    namespace: str
    selector: LabelSelector
    arc_type: str


class SetVertex(NamedTuple):
    """``svx``: add or update a vertex; ``object`` (``o``) and ``json_path`` (``j``) are JSON or None."""

    vertex: VertexId
    object: bytes | None
    json_path: bytes | None


class DeleteVertex(NamedTuple):
    """``dvx``: remove a vertex."""

    vertex: VertexId


class SetArc(NamedTuple):
    """``sarc``: add or update an arc; ``attributes`` is a bit set of ``ATTR_*``."""

    source: VertexId
    destination: VertexId
    type: str
    attributes: int


class DeleteArc(NamedTuple):
    """``darc``: remove an arc."""

    source: VertexId
    destination: VertexId
    type: str


Action = SetVertex | DeleteVertex | SetArc | DeleteArc


class GraphWarning(NamedTuple):
    """A non-terminal problem (seed 002 "Warnings"): type ``t``, message ``m``, attributes ``a``."""

    type: str
    message: str
    attributes: dict[str, str]


#: Warning types (seed 002 "Known warning type constants").
WARNING_INFORMER_SYNC_FAILED = "INFORMER_SYNC_FAILED"
WARNING_DISCOVERY_FAILED = "DISCOVERY_FAILED"
WARNING_NAMESPACE_LIST_FAILED = "NAMESPACE_LIST_FAILED"
WARNING_OBJECT_PROCESSING_FAILED = "OBJECT_PROCESSING_FAILED"
WARNING_INTERNAL_ERROR = "INTERNAL_ERROR"
