"""Objects listed in a Helm release storage ``Secret`` (type ``helm.sh/release.v1``), for list-reference arcs.

Helm 3 stores each release revision in a Secret ``sh.helm.release.v1.<release>.v<revision>``; its
``data.release`` is base64 (Kubernetes) of base64 (Helm) of gzip of the release JSON, whose ``manifest``
holds the rendered YAML documents (seed 002 "List references ... HelmRelease's Secret").
Decompression is capped so a hostile Secret cannot exhaust agentk's memory.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["HELM_RELEASE_SECRET_TYPE", "HelmObject", "HelmReleaseError", "release_objects"]

HELM_RELEASE_SECRET_TYPE = "helm.sh/release.v1"
#: Largest decompressed release document accepted, in bytes.
MAX_RELEASE_BYTES = 32 << 20

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class HelmReleaseError(ValueError):
    """The Secret's release payload cannot be decoded."""


@dataclass(frozen=True)
class HelmObject:
    """An object rendered by the release: ``apiVersion``, ``kind``, namespace ("" when not set), name."""

    api_version: str
    kind: str
    namespace: str
    name: str


def release_objects(secret: dict[str, Any]) -> tuple[str, list[HelmObject]]:
    """Decode a Helm storage Secret.

    Args:
        secret: the Secret object as decoded JSON.

    Returns:
        The release namespace and the objects of its manifest (namespace "" when the document has none;
        the caller applies the release namespace to namespaced kinds).

    Raises:
        HelmReleaseError: the payload is not base64 / gzip / JSON / YAML as expected.
    """
    encoded = (secret.get("data") or {}).get("release")
    if not isinstance(encoded, str):
        raise HelmReleaseError("secret has no data.release")
    try:
        helm_encoded = base64.b64decode(encoded, validate=True)
        raw = base64.b64decode(helm_encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HelmReleaseError(f"data.release is not base64: {exc}") from None
    if raw[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(wbits=31)
        try:
            raw = inflater.decompress(raw, MAX_RELEASE_BYTES)
        except zlib.error as exc:
            raise HelmReleaseError(f"data.release is not valid gzip: {exc}") from None
        if inflater.unconsumed_tail:
            raise HelmReleaseError(f"release is larger than {MAX_RELEASE_BYTES} bytes")
    try:
        release = json.loads(raw)
    except ValueError as exc:
        raise HelmReleaseError(f"release is not JSON: {exc}") from None
    if not isinstance(release, dict):
        raise HelmReleaseError("release is not a JSON object")
    namespace = str(release.get("namespace") or "")
    manifest = release.get("manifest") or ""
    if not isinstance(manifest, str):
        raise HelmReleaseError("release manifest is not a string")
    objects: list[HelmObject] = []
    try:
        for document in yaml.load_all(manifest, Loader=_Loader):
            objects.extend(_objects(document))
    except yaml.YAMLError as exc:
        raise HelmReleaseError(f"release manifest is not YAML: {exc}") from None
    return namespace, objects


def _objects(document: Any) -> list[HelmObject]:
    if not isinstance(document, dict):
        return []
    kind = str(document.get("kind") or "")
    if kind.endswith("List") and isinstance(document.get("items"), list):
        return [o for item in document["items"] for o in _objects(item)]
    meta = document.get("metadata") or {}
    if not isinstance(meta, dict) or not kind or not meta.get("name"):
        return []
    return [
        HelmObject(str(document.get("apiVersion") or ""), kind, str(meta.get("namespace") or ""), str(meta["name"]))
    ]
