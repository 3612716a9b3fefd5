"""Where a workspace Service's port is served: agentk resolves the Service's EndpointSlices itself.

agentk does not go through the Service's cluster IP (kube-proxy may not run where agentk runs, and the IP says
nothing about readiness): it reads the Service and its ``discovery.k8s.io/v1`` EndpointSlices and dials a ready
endpoint's address at the slice's port for the Service port's name (the target port). Only workspace Services
of this agent are resolved: the Service must carry ``agent.gitlab.com/id: <this agent>`` and the
``workspaces.gitlab.com/id`` annotation, and must not be ``ExternalName``; FQDN slices are ignored, so agentk
never becomes a dialer for any address kas names.

Answers are cached per (namespace, Service, port) for ``ttl_s`` (the editor opens many connections per page),
and forgotten when a connection to them fails.
"""

from __future__ import annotations

import ipaddress
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from cachetools import TTLCache

from tether.kube.client import KubeApiError, KubeClient, KubeError
from tether.modules.remote_development import AGENT_ID_LABEL
from tether.tool.status import StatusError

__all__ = ["Endpoint", "EndpointResolver", "ResolveError"]

#: Annotation every workspace object carries (reference §4.2).
WORKSPACE_ID_ANNOTATION = "workspaces.gitlab.com/id"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: Most (namespace, Service, port) answers kept.
_CACHE_SIZE = 4096


class ResolveError(StatusError):
    """The port cannot be resolved.

    Codes: NOT_FOUND (no such Service or port), PERMISSION_DENIED (not a workspace Service of this agent),
    UNAVAILABLE (no ready endpoint, or the API server failed).
    """


@dataclass(frozen=True)
class Endpoint:
    """A ready endpoint: ``address`` (IPv4 or IPv6 literal) and TCP ``port``."""

    address: str
    port: int

    @property
    def host(self) -> str:
        """The address as a URL host (IPv6 in brackets)."""
        return f"[{self.address}]" if ":" in self.address else self.address


def _is_ip(text: object) -> bool:
    try:
        ipaddress.ip_address(str(text))
    except ValueError:
        return False
    return True


def _ready(endpoint: dict[str, Any]) -> bool:
    # EndpointSlice API: a nil "ready" means ready (discovery.k8s.io/v1 EndpointConditions).
    return (endpoint.get("conditions") or {}).get("ready") is not False


class EndpointResolver:
    """Resolves workspace Service ports to ready endpoints.

    Args:
        kube: API client with agentk's credentials (get Services, list EndpointSlices).
        ttl_s: seconds an answer is reused.
        clock: monotonic clock (tests replace it).
    """

    def __init__(self, kube: KubeClient, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self._cache: TTLCache[tuple[str, str, int], list[Endpoint]] = TTLCache(_CACHE_SIZE, ttl_s, timer=clock)

    def forget(self, namespace: str, service: str, port: int) -> None:
        """Drop the cached answer (a connection to it failed)."""
        self._cache.pop((namespace, service, port), None)

    async def resolve(self, namespace: str, service: str, port: int, agent_id: int) -> Endpoint:
        """A ready endpoint of Service ``namespace/service`` for Service port ``port``, chosen at random.

        Raises:
            ResolveError: see the class.
        """
        key = (namespace, service, port)
        endpoints = self._cache.get(key)
        if endpoints is None:
            endpoints = await self._lookup(namespace, service, port, agent_id)
            self._cache[key] = endpoints
        return random.choice(endpoints)

    async def _lookup(self, namespace: str, service: str, port: int, agent_id: int) -> list[Endpoint]:
        where = f"Service {namespace}/{service}"
        try:
            svc = await self._kube.get_json(f"/api/v1/namespaces/{namespace}/services/{service}")
            slices = await self._kube.get_json(
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                {"labelSelector": f"{SERVICE_NAME_LABEL}={service}"},
            )
        except KubeApiError as exc:
            if exc.status == 404:
                raise ResolveError(grpc.StatusCode.NOT_FOUND, f"{where} does not exist") from exc
            raise ResolveError(grpc.StatusCode.UNAVAILABLE, f"reading {where} failed: {exc.message}") from exc
        except KubeError as exc:
            raise ResolveError(grpc.StatusCode.UNAVAILABLE, f"reading {where} failed: {exc}") from exc
        meta = svc.get("metadata") or {}
        spec = svc.get("spec") or {}
        if (meta.get("labels") or {}).get(AGENT_ID_LABEL) != str(agent_id) or WORKSPACE_ID_ANNOTATION not in (
            meta.get("annotations") or {}
        ):
            raise ResolveError(grpc.StatusCode.PERMISSION_DENIED, f"{where} is not a workspace Service of this agent")
        if spec.get("type") == "ExternalName":
            raise ResolveError(grpc.StatusCode.PERMISSION_DENIED, f"{where} is an ExternalName Service")
        port_name = next((p.get("name") or "" for p in spec.get("ports") or () if p.get("port") == port), None)
        if port_name is None:
            raise ResolveError(grpc.StatusCode.NOT_FOUND, f"{where} does not expose port {port}")
        found: list[Endpoint] = []
        for item in slices.get("items") or ():
            if item.get("addressType") not in ("IPv4", "IPv6"):
                continue
            target = next((p.get("port") for p in item.get("ports") or () if (p.get("name") or "") == port_name), None)
            if not isinstance(target, int) or not 0 < target < 65536:
                continue
            found += [
                Endpoint(address, target)
                for endpoint in item.get("endpoints") or ()
                if _ready(endpoint)
                for address in (endpoint.get("addresses") or ())[:1]
                if _is_ip(address)
            ]
        if not found:
            raise ResolveError(
                grpc.StatusCode.UNAVAILABLE, f"{where} has no ready endpoint for port {port}: is the workspace running?"
            )
        return found
