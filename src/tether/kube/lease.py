"""Leader election with a ``coordination.k8s.io/v1`` Lease (client-go's ``leaderelection`` behaviour).

The holder renews ``spec.renewTime`` every ``retry_period_s``; a candidate takes the Lease over when it has
seen the same ``renewTime`` unchanged for ``lease_duration_s`` (measured on its own clock, so clock skew
between pods does not matter). Every write is an optimistic update on ``resourceVersion``: two candidates
cannot both win. A leader that cannot renew for ``renew_deadline_s`` stops leading, even while a renewal is
still unanswered (each attempt is bounded by what is left of the deadline); on a clean stop it
releases the Lease so a successor takes over at once. Upstream agentk: Lease ``agent-<id>-lock`` in the pod's
namespace, identity the pod name, 15 s / 10 s / 2 s (reference workspaces.md §5.1).

The Lease is created at run time, so ``helm uninstall`` would leave it behind. Unlike upstream, the Lease gets
an ownerReference to the workload that runs the candidates (the agentk Deployment, found by
:func:`workload_owner` from the pod through its ReplicaSet): when the workload is deleted, the API server's
garbage collector deletes the Lease too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog

from tether.kube.client import KubeApiError, KubeClient, KubeError

_log = structlog.get_logger(__name__)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Runs ``lead()`` while this process holds the Lease.

    Args:
        client: API client.
        namespace: the Lease's namespace (the agentk pod's).
        name: the Lease's name, e.g. ``agent-7-lock``.
        identity: this candidate (the pod name; unique among the replicas).
        lease_duration_s, renew_deadline_s, retry_period_s: the timings (upstream 15 / 10 / 2).
        owner: an ownerReference (``apiVersion``, ``kind``, ``name``, ``uid``) written on the Lease when this
            candidate creates or takes it and the Lease has none (:func:`workload_owner`); None: no owner.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        owner: dict[str, Any] | None = None,
    ) -> None:
        self._client = client
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._namespace = namespace
        self.name = name
        self.identity = identity
        self._duration = lease_duration_s
        self._deadline = renew_deadline_s
        self._retry = retry_period_s
        self._owner = owner
        self._observed: tuple[str, str, float] | None = None  # (holder, renewTime, local time first seen)
        self.leading = False

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Forever: acquire, run ``lead()`` while renewing, cancel it when leadership is lost, try again.

        ``lead`` is cancelled when leadership is lost or when ``run`` itself is cancelled; the Lease is then
        released (best effort).
        """
        try:
            while True:
                acquired = await self._acquire()
                self.leading = True
                _log.info("leader_elected", lease=self.name, identity=self.identity)
                task = asyncio.create_task(lead(), name=f"leader {self.name}")
                try:
                    await self._renew_until_lost(task, acquired)
                finally:
                    self.leading = False
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                _log.warning("leader_lost", lease=self.name, identity=self.identity)
        finally:
            with contextlib.suppress(KubeError, asyncio.CancelledError):
                await asyncio.shield(self._release())

    async def _acquire(self) -> float:
        """Try until this candidate holds the Lease; returns when (monotonic) the winning attempt began."""
        while True:
            began = time.monotonic()
            try:
                if await self._try_acquire_or_renew():
                    return began
            except KubeError as exc:
                _log.warning("leader_election_error", lease=self.name, error=str(exc))
            await asyncio.sleep(self._retry)

    async def _renew_until_lost(self, task: asyncio.Task[None], acquired: float) -> None:
        # Measured from the start of the last successful attempt: the renewTime it wrote, from which the others
        # count leaseDurationSeconds, is no earlier. Each attempt gets only what is left of renew_deadline, as
        # client-go's renew context: an API server that never answers must not keep a leader past its deadline,
        # into the time where another candidate may already lead.
        last_renewed = acquired
        while not task.done():
            await asyncio.wait({task}, timeout=self._retry)
            if task.done():
                break
            began = time.monotonic()
            left = self._deadline - (began - last_renewed)
            if left <= 0:
                return
            try:
                async with asyncio.timeout(left):
                    renewed = await self._try_acquire_or_renew()
            except KubeError as exc:
                _log.warning("lease_renew_failed", lease=self.name, error=str(exc))
                continue
            except TimeoutError:
                _log.warning("lease_renew_failed", lease=self.name, error=f"no answer within {left:.1f} s")
                return
            if not renewed:
                return  # someone else holds it now
            last_renewed = began
        if task.done() and not task.cancelled() and task.exception() is not None:
            _log.error("leader_task_failed", lease=self.name, error=repr(task.exception()))

    def _spec(self, acquire: bool, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _now()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self._duration),
            "renewTime": now,
            "acquireTime": now if acquire else (previous or {}).get("acquireTime", now),
            "leaseTransitions": int((previous or {}).get("leaseTransitions", 0)) + (1 if acquire and previous else 0),
        }
        return spec

    async def _try_acquire_or_renew(self) -> bool:
        try:
            lease = await self._client.get_json(self._path)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self._namespace, **self._owned({})},
                "spec": self._spec(True, None),
            }
            try:
                await self._client.send_json("POST", self._collection, body)
            except KubeApiError as create_error:
                if create_error.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        renew = str(spec.get("renewTime") or "")
        if holder and holder != self.identity:
            now = time.monotonic()
            if self._observed is None or self._observed[:2] != (holder, renew):
                self._observed = (holder, renew, now)
                return False
            duration = float(spec.get("leaseDurationSeconds") or self._duration)
            if now - self._observed[2] < duration:
                return False
        lease["spec"] = self._spec(holder != self.identity, spec)
        lease["metadata"].update(self._owned(lease["metadata"]))
        try:
            await self._client.send_json("PUT", self._path, lease)
        except KubeApiError as exc:
            if exc.status == 409:  # someone else wrote it first
                return False
            raise
        return True

    def _owned(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """``{"ownerReferences": [owner]}`` for a Lease without owners (created by an older agentk), else ``{}``."""
        if self._owner is None or metadata.get("ownerReferences"):
            return {}
        return {"ownerReferences": [self._owner]}

    async def _release(self) -> None:
        lease = await self._client.get_json(self._path)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        spec["holderIdentity"] = ""
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = _now()
        lease["spec"] = spec
        await self._client.send_json("PUT", self._path, lease)
        _log.info("lease_released", lease=self.name, identity=self.identity)


def _controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller")), None)


async def workload_owner(client: KubeClient, namespace: str, pod_name: str) -> dict[str, Any] | None:
    """The ownerReference for a Lease of the workload that runs pod ``pod_name`` (``apiVersion``, ``kind``, ...).

    Its Deployment when the pod belongs to a ReplicaSet of one, else the pod's own controller (a StatefulSet,
    ...); None for a bare pod or when the pod cannot be read (outside a cluster, or without ``get`` on pods
    and replicasets: logged).

    The reference is not a controller reference and does not block the owner's deletion (which would need
    ``update`` on the owner's finalizers): the garbage collector deletes the Lease after its owner.
    """
    if not pod_name:
        return None
    try:
        pod = await client.get_json(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
        owner = _controller(pod)
        if owner is not None and owner.get("kind") == "ReplicaSet" and owner.get("apiVersion") == "apps/v1":
            replica_set = await client.get_json(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{owner['name']}")
            owner = _controller(replica_set) or owner
    except KubeError as exc:
        _log.warning("lease_owner_unknown", pod=pod_name, error=str(exc))
        return None
    if owner is None:
        return None
    return {key: owner[key] for key in ("apiVersion", "kind", "name", "uid")}
