"""What a Kubernetes API request does, read from its method, path and query as the API server reads it.

The rules of apiserver's ``RequestInfoFactory.NewRequestInfo`` (k8s.io/apiserver/pkg/endpoints/request): paths
under ``/api`` (the core group) and ``/apis/<group>`` are resource requests; ``/api/<version>/...`` and
``/apis/<group>/<version>/...`` then hold ``[watch|proxy/]`` ``[namespaces/<ns>/]<resource>[/<name>[/<sub>]]``.
The verb follows the method (POST create, GET/HEAD get, PUT update, PATCH patch, DELETE delete); a get without a
name is a list, or a watch with ``?watch=true``; a delete without a name is a deletecollection; a name-less list
may name its object with ``fieldSelector=metadata.name=<name>``. Any other path is a non-resource request whose
verb is the lower-case method. One Tether addition for the audit trail (issue 25): the ``exec``, ``attach`` and
``portforward`` subresources of pods get those names as their verb instead of create/get.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RequestInfo", "request_info"]

_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
#: Subresources of a namespace that are not resources in their own right (``/namespaces/<ns>/status``).
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
#: Subresources of pods reported as their own verb in audit events.
_STREAM_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})


@dataclass(frozen=True)
class RequestInfo:
    """The parsed request; empty strings for what does not apply (a non-resource request has only ``verb``)."""

    verb: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""


def request_info(method: str, path: str, query: Mapping[str, str]) -> RequestInfo:
    """Parse one request (module docstring).

    Args:
        method: the HTTP method, e.g. ``GET``.
        path: the URL path below the proxy prefix, e.g. ``/api/v1/namespaces/default/pods/web``.
        query: the decoded query parameters (``watch``, ``fieldSelector``).
    """
    other = RequestInfo(verb=method.lower())
    parts = [part for part in path.strip("/").split("/")]
    if len(parts) < 2 or parts[0] not in ("api", "apis"):
        return other
    group = ""
    if parts[0] == "apis":
        if len(parts) < 3:
            return other
        group, parts = parts[1], parts[2:]
    else:
        parts = parts[1:]
    version, parts = parts[0], parts[1:]
    if not parts or not parts[0]:
        return other  # e.g. /api/v1: discovery
    watch = False
    if parts[0] in ("watch", "proxy"):
        if len(parts) < 2:
            return other
        verb, parts, watch = parts[0], parts[1:], parts[0] == "watch"
    else:
        verb = _VERBS.get(method.upper(), "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        watch = watch or query.get("watch", "").lower() in ("true", "1")
        verb = "watch" if watch else "list"
        selector = query.get("fieldSelector", "")
        if selector.startswith("metadata.name=") and "," not in selector:
            name = selector.removeprefix("metadata.name=")
    elif not name and verb == "delete":
        verb = "deletecollection"
    if resource == "pods" and subresource in _STREAM_SUBRESOURCES:
        verb = subresource
    return RequestInfo(verb, True, group, version, namespace, resource, subresource, name)
