"""Discovery of every group/version/resource the API server serves, CRDs included (stack.md §6).

Uses aggregated discovery (``/api`` and ``/apis`` with the ``apidiscovery.k8s.io/v2`` media type: two
requests for the whole cluster) and falls back to legacy discovery (``/api``, ``/api/v1``, ``/apis`` and one
request per group/version) when the server does not offer it. Subresources (``pods/log``,
``deployments/scale``) are never returned. Partial failures — a stale aggregated API, one group/version
that cannot be read — are reported in :attr:`Discovery.failures` next to everything that could be read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tether.kube.client import KubeClient, KubeError

__all__ = ["AGGREGATED_ACCEPT", "ApiResource", "Discovery", "discover"]

#: Accept header asking for aggregated discovery (v2, then v2beta1), with plain JSON as the fallback.
AGGREGATED_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json"
)


@dataclass(frozen=True)
class ApiResource:
    """One resource of one group/version.

    Attributes:
        group: API group, "" for the core group.
        version: e.g. ``v1``, ``v1beta1``.
        resource: plural resource name, e.g. ``deployments``.
        kind: e.g. ``Deployment``.
        namespaced: True for namespace-scoped resources.
        verbs: e.g. ``{"get", "list", "watch"}``.
    """

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    verbs: frozenset[str] = frozenset()

    @property
    def api_version(self) -> str:
        """``group/version`` or ``version`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str = "") -> str:
        """URL path of the collection, in ``namespace`` or across all namespaces when "".

        Args:
            namespace: the namespace for namespaced resources; ignored for cluster-scoped ones.
        """
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            return f"{base}/namespaces/{namespace}/{self.resource}"
        return f"{base}/{self.resource}"


@dataclass(frozen=True)
class Discovery:
    """Result of one discovery pass.

    Attributes:
        resources: every resource that could be read, in server order.
        failures: human-readable descriptions of what could not be read (group/version and reason).
    """

    resources: tuple[ApiResource, ...]
    failures: tuple[str, ...] = field(default=())


async def discover(client: KubeClient) -> Discovery:
    """Read every resource of the cluster.

    Raises:
        KubeError: neither ``/api`` nor ``/apis`` could be read (nothing is known).
    """
    core = await client.get_json("/api", accept=AGGREGATED_ACCEPT)
    groups = await client.get_json("/apis", accept=AGGREGATED_ACCEPT)
    if core.get("kind") == "APIGroupDiscoveryList" and groups.get("kind") == "APIGroupDiscoveryList":
        resources: list[ApiResource] = []
        failures: list[str] = []
        for document in (core, groups):
            _parse_aggregated(document, resources, failures)
        return Discovery(tuple(resources), tuple(failures))
    return await _legacy(client, core, groups)


def _parse_aggregated(document: dict[str, Any], resources: list[ApiResource], failures: list[str]) -> None:
    for group in document.get("items") or []:
        group_name = str((group.get("metadata") or {}).get("name") or "")
        for version in group.get("versions") or []:
            version_name = str(version.get("version") or "")
            if version.get("freshness") == "Stale":
                failures.append(f"{_gv(group_name, version_name)}: discovery information is stale")
                continue
            for res in version.get("resources") or []:
                name = str(res.get("resource") or "")
                if not name or "/" in name:
                    continue
                kind = str((res.get("responseKind") or {}).get("kind") or "")
                resources.append(
                    ApiResource(
                        group=group_name,
                        version=version_name,
                        resource=name,
                        kind=kind,
                        namespaced=res.get("scope") == "Namespaced",
                        verbs=frozenset(str(v) for v in res.get("verbs") or []),
                    )
                )


async def _legacy(client: KubeClient, core: dict[str, Any], groups: dict[str, Any]) -> Discovery:
    versions: list[tuple[str, str, str]] = []  # (group, version, path)
    for version in core.get("versions") or []:
        versions.append(("", str(version), f"/api/{version}"))
    for group in groups.get("groups") or []:
        for version in group.get("versions") or []:
            group_version = str(version.get("groupVersion") or "")
            versions.append((str(group.get("name") or ""), str(version.get("version") or ""), f"/apis/{group_version}"))

    async def read(path: str) -> dict[str, Any] | KubeError:
        try:
            return await client.get_json(path)
        except KubeError as exc:
            return exc

    documents = await asyncio.gather(*(read(path) for _, _, path in versions))
    resources: list[ApiResource] = []
    failures: list[str] = []
    for (group, version, _), document in zip(versions, documents, strict=True):
        if isinstance(document, KubeError):
            failures.append(f"{_gv(group, version)}: {document}")
            continue
        resources.extend(_legacy_resources(group, version, document.get("resources") or []))
    return Discovery(tuple(resources), tuple(failures))


def _legacy_resources(group: str, version: str, entries: Iterable[Any]) -> Iterable[ApiResource]:
    for entry in entries:
        name = str(entry.get("name") or "")
        if not name or "/" in name:
            continue
        yield ApiResource(
            group=group,
            version=version,
            resource=name,
            kind=str(entry.get("kind") or ""),
            namespaced=bool(entry.get("namespaced")),
            verbs=frozenset(str(v) for v in entry.get("verbs") or []),
        )


def _gv(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version
