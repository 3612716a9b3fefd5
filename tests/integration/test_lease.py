"""Leader election on a real Lease: one leader among candidates, release on stop, takeover after a crash."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.polling import poll
from tether.devenv.cluster import ClusterInfo
from tether.kube.client import KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.kube.lease import LeaderElector

pytestmark = pytest.mark.k8s


async def test_one_leader_release_and_takeover(k8s_cluster: ClusterInfo, k8s_namespace: str) -> None:
    kube = KubeClient(load_credentials(str(k8s_cluster.kubeconfig)))
    leading: list[str] = []

    def candidate(identity: str) -> tuple[LeaderElector, asyncio.Task[None]]:
        elector = LeaderElector(
            kube, k8s_namespace, "agent-1-lock", identity, lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.5
        )

        async def lead() -> None:
            leading.append(identity)
            try:
                await asyncio.Event().wait()
            finally:
                leading.remove(identity)

        return elector, asyncio.create_task(elector.run(lead))

    try:
        _a, task_a = candidate("pod-a")
        await poll(lambda: asyncio.sleep(0, leading == ["pod-a"]), "pod-a leads", limit=10)
        b, task_b = candidate("pod-b")
        await asyncio.sleep(2)
        assert leading == ["pod-a"] and not b.leading

        # Clean stop: the Lease is released and pod-b takes over at once.
        task_a.cancel()
        await asyncio.gather(task_a, return_exceptions=True)
        await poll(lambda: asyncio.sleep(0, leading == ["pod-b"]), "pod-b takes over after release", limit=5)

        # Crash: pod-b stops renewing without releasing; pod-c waits out the lease duration, then leads.
        _c, task_c = candidate("pod-c")
        b._release = asyncio.sleep  # type: ignore[method-assign,assignment]  # a crash releases nothing
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)
        await poll(lambda: asyncio.sleep(0, leading == ["pod-c"]), "pod-c takes over after expiry", limit=15)
        lease = await kube.get_json(f"/apis/coordination.k8s.io/v1/namespaces/{k8s_namespace}/leases/agent-1-lock")
        assert lease["spec"]["holderIdentity"] == "pod-c" and lease["spec"]["leaseTransitions"] >= 2
        task_c.cancel()
        await asyncio.gather(task_c, return_exceptions=True)
    finally:
        await kube.close()
