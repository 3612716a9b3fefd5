r"""Which group+version+resource triples to watch (seed 002 "queries" and "queries - version selection").

1. Subresources are never considered (discovery drops them); resources in the co-habitation groups
   ``extensions`` and ``events.k8s.io`` are always excluded (seed 002 "Groups, versions, resources"), as
   are resources that cannot be listed and watched (no ``list`` / ``watch`` verb: nothing to observe).
2. Each remaining triple is matched against the queries in order; the first query whose
   ``resource_selector_expression`` is true decides: ``exclude`` drops it, ``include`` makes it a candidate
   together with that query's object filter.
3. Per group+resource at most one candidate version is watched: the newest stable version (``^v\d+$``),
   else the newest unstable one, in natural order (``v2`` < ``v10``, ``v1alpha1`` < ``v1beta1`` < ``v1``
   only through the stable-first rule).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from tether.kube.discovery import ApiResource
from tether.modules.graph.engine.cel import CelEvaluationError
from tether.modules.graph.engine.request import ObjectFilter, SelectedQuery

__all__ = [
    "EXCLUDED_GROUPS",
    "Selection",
    "WatchedResource",
    "is_stable",
    "natural_key",
    "select_resources",
    "select_version",
]

#: Co-habitation groups: their resources are served again by other groups (``apps``, ``networking.k8s.io``,
#: core ``events``), so they are never watched. ``events`` is listed as the seed names it.
EXCLUDED_GROUPS = frozenset({"extensions", "events.k8s.io", "events"})

_STABLE = re.compile(r"^v\d+$")
_CHUNKS = re.compile(r"(\d+)")


def is_stable(version: str) -> bool:
    r"""True for versions like ``v1`` or ``v12`` (``^v\d+$``)."""
    return bool(_STABLE.match(version))


def natural_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key giving natural order: digit runs compare as numbers (``v2`` < ``v10``), text as text."""
    return tuple((0, int(chunk)) if chunk.isdigit() else (1, chunk) for chunk in _CHUNKS.split(version) if chunk)


def select_version(versions: Iterable[str]) -> str | None:
    """The version to watch among ``versions``: the newest stable one, else the newest unstable one.

    Returns:
        None when ``versions`` is empty.
    """
    candidates = list(versions)
    stable = [v for v in candidates if is_stable(v)]
    pool = stable or candidates
    return max(pool, key=natural_key) if pool else None


@dataclass(frozen=True)
class WatchedResource:
    """A selected resource and the filter of the query that included it.

    Attributes:
        api: discovery information (group, version, resource, kind, scope).
        object_filter: label/field selectors, CEL filter and JSONPath of the including query.
        query_index: index of the including query.
    """

    api: ApiResource
    object_filter: ObjectFilter
    query_index: int

    @property
    def group(self) -> str:
        """API group ("" for core)."""
        return self.api.group

    @property
    def version(self) -> str:
        """Selected version."""
        return self.api.version

    @property
    def resource(self) -> str:
        """Plural resource name."""
        return self.api.resource

    @property
    def namespaced(self) -> bool:
        """True for namespace-scoped resources."""
        return self.api.namespaced

    @property
    def kind(self) -> str:
        """Object kind."""
        return self.api.kind


@dataclass(frozen=True)
class Selection:
    """The watched resources and lookups used to resolve references.

    Attributes:
        resources: one per group+resource, in discovery order.
        errors: queries whose expression failed to evaluate on some triple (for a warning).
    """

    resources: tuple[WatchedResource, ...] = ()
    errors: tuple[str, ...] = ()
    _by_resource: dict[tuple[str, str], WatchedResource] = field(default_factory=dict, repr=False, compare=False)
    _by_kind: dict[tuple[str, str], WatchedResource] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for watched in self.resources:
            self._by_resource.setdefault((watched.group, watched.resource), watched)
            if watched.kind:
                self._by_kind.setdefault((watched.group, watched.kind), watched)

    def by_resource(self, group: str, resource: str) -> WatchedResource | None:
        """The watched resource for group+resource, or None when it is not watched."""
        return self._by_resource.get((group, resource))

    def by_kind(self, group: str, kind: str) -> WatchedResource | None:
        """The watched resource for group+kind, or None when it is not watched."""
        return self._by_kind.get((group, kind))

    def by_api_version_kind(self, api_version: str, kind: str) -> WatchedResource | None:
        """Resolve an ``apiVersion`` (``apps/v1``, ``v1``) + ``kind`` pair, as in owner references."""
        group = api_version.rpartition("/")[0]
        return self._by_kind.get((group, kind))


def select_resources(resources: Iterable[ApiResource], queries: Iterable[SelectedQuery]) -> Selection:
    """Apply the queries and version selection to discovery output.

    Args:
        resources: every discovered resource (subresources already removed).
        queries: compiled queries in request order.
    """
    query_list = list(queries)
    candidates: dict[tuple[str, str], list[tuple[ApiResource, SelectedQuery]]] = {}
    errors: list[str] = []
    failed: set[int] = set()
    for api in resources:
        if api.group in EXCLUDED_GROUPS or "/" in api.resource:
            continue
        if not {"list", "watch"} <= api.verbs:
            continue
        variables = {"group": api.group, "version": api.version, "resource": api.resource, "namespaced": api.namespaced}
        for query in query_list:
            try:
                matched = query.resource_expression.evaluate(variables)
            except CelEvaluationError as exc:
                if query.index not in failed:
                    failed.add(query.index)
                    errors.append(f"queries[{query.index}]: evaluating the resource selector expression failed: {exc}")
                continue
            if matched:
                if query.include:
                    candidates.setdefault((api.group, api.resource), []).append((api, query))
                break
    chosen: list[WatchedResource] = []
    for options in candidates.values():
        version = select_version(api.version for api, _ in options)
        for api, query in options:
            if api.version == version:
                chosen.append(WatchedResource(api, query.object_filter, query.index))
                break
    return Selection(tuple(chosen), tuple(errors))
