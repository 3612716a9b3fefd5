"""Applying ``config_to_apply``: server-side apply grouped by inventory, then prune (reference §5.7).

Objects are grouped by cli-utils inventory (a ConfigMap labelled ``cli-utils.sigs.k8s.io/inventory-id``;
every other object names its inventory in ``config.k8s.io/owning-inventory``). Per inventory: the inventory
is first written with the union of what it owned and what is wanted, every object is applied (server-side
apply, ``force``, field manager ``agentk``), objects no longer wanted are deleted, and the inventory is
written again with only what is wanted. The inventory's ``data`` keys are cli-utils' object references
``<namespace>_<name>_<group>_<kind>``. An empty inventory therefore prunes everything it owned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from tether.kube.client import KubeApiError, KubeClient, KubeError
from tether.modules.remote_development.protocol import INVENTORY_ID_LABEL, OWNING_INVENTORY

FIELD_MANAGER = "agentk"
#: The kinds workspaces are made of -> their plural resource name.
PLURALS: Mapping[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "ResourceQuota"): "resourcequotas",
    ("apps/v1", "Deployment"): "deployments",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
}
_VERSIONS = {kind: api_version for api_version, kind in PLURALS}


class ConfigError(ValueError):
    """``config_to_apply`` cannot be applied as given (not YAML, no inventory, unknown kind)."""


@dataclass
class _Group:
    inventory: dict[str, Any]
    objects: list[dict[str, Any]] = field(default_factory=list)


def object_path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    """The API path of a namespaced object (or its collection when ``name`` is empty).

    Raises:
        ConfigError: a kind workspaces are not made of.
    """
    plural = PLURALS.get((api_version, kind))
    if plural is None:
        raise ConfigError(f"{api_version} {kind} is not a workspace resource kind")
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


def reference(obj: Mapping[str, Any]) -> str:
    """cli-utils' object reference ``<namespace>_<name>_<group>_<kind>``."""
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}_{meta.get('name', '')}_{group}_{obj.get('kind', '')}"


def _from_reference(ref: str) -> tuple[str, str, str, str]:
    namespace, name, group, kind = ref.split("_", 3)
    api_version = _VERSIONS.get(kind, f"{group}/v1" if group else "v1")
    return namespace, name, api_version, kind


def group_by_inventory(config: str) -> list[_Group]:
    """Parse the YAML stream and group it by inventory (reference §5.7 error texts).

    Raises:
        ConfigError: not YAML, "no inventory found", "no owning inventory found", or an unknown inventory.
    """
    try:
        documents = [d for d in yaml.load_all(config, Loader=yaml.CSafeLoader) if d]
    except yaml.YAMLError as exc:
        raise ConfigError(f"config_to_apply is not YAML: {exc}") from exc
    groups: dict[str, _Group] = {}
    others: list[dict[str, Any]] = []
    for doc in documents:
        if not isinstance(doc, dict):
            raise ConfigError("config_to_apply holds a document that is not an object")
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if doc.get("kind") == "ConfigMap" and INVENTORY_ID_LABEL in labels:
            groups[str(labels[INVENTORY_ID_LABEL])] = _Group(doc)
        else:
            others.append(doc)
    if documents and not groups:
        raise ConfigError("no inventory found")
    for doc in others:
        owner = ((doc.get("metadata") or {}).get("annotations") or {}).get(OWNING_INVENTORY)
        if owner is None:
            raise ConfigError(f"no owning inventory found for {doc.get('kind')} {doc.get('metadata', {}).get('name')}")
        if owner not in groups:
            raise ConfigError(f"{doc.get('kind')} names unknown inventory {owner!r}")
        groups[owner].objects.append(doc)
    return list(groups.values())


class Applier:
    """Applies workspace configurations with one API client.

    Args:
        client: API client with agentk's credentials.
    """

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def _apply(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        path = object_path(str(obj["apiVersion"]), str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))
        await self._client.send_json(
            "PATCH",
            path,
            obj,
            {"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def apply(self, config: str, namespace: str) -> list[str]:
        """Apply one workspace's ``config_to_apply``; returns the errors (empty when all went well).

        Every object must be in the workspace's ``namespace`` (Tether: a workspace cannot touch other
        namespaces, whatever the hub sends). Each error names the object:
        ``Deployment ns/name: <the API server's message>``.
        """
        try:
            groups = group_by_inventory(config)
        except ConfigError as exc:
            return [str(exc)]
        for group in groups:
            for obj in [group.inventory, *group.objects]:
                meta = obj.get("metadata") or {}
                if meta.get("namespace") != namespace:
                    return [f"{obj.get('kind')} {meta.get('name')}: not in the workspace namespace {namespace!r}"]
        errors: list[str] = []
        for group in groups:
            errors += await self._apply_group(group)
        return errors

    async def _apply_group(self, group: _Group) -> list[str]:
        inventory = group.inventory
        meta = inventory["metadata"]
        path = object_path("v1", "ConfigMap", str(meta["namespace"]), str(meta["name"]))
        try:
            current = await self._client.get_json(path)
            owned = set((current.get("data") or {}).keys())
        except KubeApiError as exc:
            if exc.status != 404:
                return [f"ConfigMap {meta['namespace']}/{meta['name']}: {exc}"]
            owned = set()
        except KubeError as exc:
            return [f"ConfigMap {meta['namespace']}/{meta['name']}: {exc}"]
        wanted = {reference(obj) for obj in group.objects}
        errors: list[str] = []
        try:
            await self._apply({**inventory, "data": dict.fromkeys(sorted(owned | wanted), "")})
        except KubeError as exc:
            return [f"ConfigMap {meta['namespace']}/{meta['name']}: {exc}"]
        for obj in group.objects:
            try:
                await self._apply(obj)
            except (KubeError, ConfigError) as exc:
                errors.append(
                    f"{obj.get('kind')} {obj['metadata'].get('namespace')}/{obj['metadata'].get('name')}: {exc}"
                )
        if errors:
            return errors
        for ref in sorted(owned - wanted):
            namespace, name, api_version, kind = _from_reference(ref)
            try:
                await self._client.send_json("DELETE", object_path(api_version, kind, namespace, name))
            except KubeApiError as exc:
                if exc.status != 404:
                    errors.append(f"prune {kind} {namespace}/{name}: {exc}")
            except (KubeError, ConfigError) as exc:
                errors.append(f"prune {kind} {namespace}/{name}: {exc}")
        if not errors:
            try:
                await self._apply({**inventory, "data": dict.fromkeys(sorted(wanted), "")})
            except KubeError as exc:
                errors.append(f"ConfigMap {meta['namespace']}/{meta['name']}: {exc}")
        return errors
