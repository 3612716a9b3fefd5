"""Leader election on a real Lease (client-go ``leaderelection`` behaviour, reference workspaces.md §5.1).

One leader among candidates; a clean stop releases the Lease and a follower takes over at once; a leader that
crashes releases nothing, so its follower waits until the Lease has gone unrenewed for ``leaseDurationSeconds``;
a leader that cannot renew (API server unreachable or not answering for it, or its Lease taken) stops leading
within ``renew_deadline``, before anyone else may lead. Each candidate has its own client; the ones whose API
server goes away reach it through a :class:`~tests.support.tcp_proxy.TcpRelay` the test cuts. The same holds
for agentk's leader-only modules behind :class:`tether.modagent.leader.LeaderOnlyModules`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.polling import poll
from tests.support.tcp_proxy import TcpRelay
from tether.kube.client import KubeApiError, KubeClient
from tether.kube.kubeconfig import load_credentials
from tether.kube.lease import LeaderElector, workload_owner
from tether.modagent.api import AgentApi
from tether.modagent.internal_server import InternalServer
from tether.modagent.leader import build_modules
from tether.modshared.supervisor import ModuleSupervisor
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2
from tether_devenv.cluster import ClusterInfo

pytestmark = pytest.mark.k8s

LEASE = "agent-1-lock"
#: Seconds; short so the tests run quickly, in the upstream proportions (duration > deadline > retry).
DURATION, DEADLINE, RETRY = 6.0, 2.0, 0.5


@dataclass
class Leadership:
    """Who leads, and every start and stop of a leader: (wall time, identity, "start" | "stop")."""

    leading: list[str] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)

    def lead(self, identity: str) -> Any:
        async def lead() -> None:
            self.leading.append(identity)
            self.events.append((time.time(), identity, "start"))
            try:
                await asyncio.Event().wait()
            finally:
                self.events.append((time.time(), identity, "stop"))
                self.leading.remove(identity)

        return lead

    def first(self, identity: str, what: str) -> float:
        return next(at for at, who, kind in self.events if who == identity and kind == what)

    def most_at_once(self) -> int:
        """The most candidates that led at the same time, over the whole test."""
        now, most = 0, 0
        for _, _, kind in self.events:
            now += 1 if kind == "start" else -1
            most = max(most, now)
        return most


@dataclass
class Candidates:
    cluster: ClusterInfo
    namespace: str
    leadership: Leadership = field(default_factory=Leadership)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _closers: list[Any] = field(default_factory=list)
    _relays: list[TcpRelay] = field(default_factory=list)

    async def client(self, relay: TcpRelay | None = None) -> KubeClient:
        credentials = load_credentials(str(self.cluster.kubeconfig))
        if relay is not None:
            credentials = dataclasses.replace(credentials, server=f"https://127.0.0.1:{relay.port}")
        client = KubeClient(credentials)
        self._closers.append(client.close)
        return client

    async def relay(self) -> TcpRelay:
        host, port = self.cluster.server.removeprefix("https://").rsplit(":", 1)
        relay = await TcpRelay(host, int(port)).start()
        self._relays.append(relay)
        return relay

    async def start(self, identity: str, relay: TcpRelay | None = None) -> LeaderElector:
        elector = LeaderElector(
            await self.client(relay),
            self.namespace,
            LEASE,
            identity,
            lease_duration_s=DURATION,
            renew_deadline_s=DEADLINE,
            retry_period_s=RETRY,
        )
        self._tasks[identity] = asyncio.create_task(elector.run(self.leadership.lead(identity)))
        return elector

    async def stop(self, identity: str) -> None:
        task = self._tasks.pop(identity)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def wait_leader(self, identity: str, what: str, limit: float = 30) -> None:
        await poll(lambda: asyncio.sleep(0, self.leadership.leading == [identity]), what, limit=limit)

    async def lease(self) -> dict[str, Any]:
        admin = await self.client()
        lease: dict[str, Any] = await admin.get_json(
            f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}"
        )
        return lease

    async def close(self) -> None:
        for relay in self._relays:  # first, so that no release waits on a stalled connection
            await relay.close()
        for identity in list(self._tasks):
            await self.stop(identity)
        for close in reversed(self._closers):
            await close()


@pytest.fixture
async def candidates(k8s_cluster: ClusterInfo, k8s_namespace: str) -> AsyncIterator[Candidates]:
    created = Candidates(k8s_cluster, k8s_namespace)
    try:
        yield created
    finally:
        await created.close()


def renewed_at(lease: dict[str, Any]) -> float:
    """The Lease's ``spec.renewTime`` as unix time (the API server and the test share a clock)."""
    return datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00")).timestamp()


async def test_one_leader_and_a_released_lease_is_taken_at_once(candidates: Candidates) -> None:
    await candidates.start("pod-a")
    await candidates.wait_leader("pod-a", "pod-a leads")
    b = await candidates.start("pod-b")
    await asyncio.sleep(2 * RETRY)  # pod-b tries at least once and finds the Lease held
    assert candidates.leadership.leading == ["pod-a"] and not b.leading

    stopped = time.time()
    await candidates.stop("pod-a")  # clean stop: the Lease is released
    lease = await candidates.lease()
    assert lease["spec"]["holderIdentity"] in ("", "pod-b"), lease["spec"]
    await candidates.wait_leader("pod-b", "pod-b takes over after the release")
    # At once: long before pod-a's last renewal would have expired.
    assert candidates.leadership.first("pod-b", "start") < stopped + DURATION - RETRY
    assert candidates.leadership.most_at_once() == 1


async def test_after_a_crash_the_follower_waits_until_the_lease_expires(candidates: Candidates) -> None:
    relay = await candidates.relay()
    await candidates.start("pod-a", relay)
    await candidates.wait_leader("pod-a", "pod-a leads")
    await candidates.start("pod-b")
    await asyncio.sleep(2 * RETRY)  # pod-b has seen pod-a's renewals

    # A crash: pod-a's process is gone without a word to the API server (its release cannot get there).
    relay.refuse()
    await candidates.stop("pod-a")
    lease = await candidates.lease()
    assert lease["spec"]["holderIdentity"] == "pod-a", "the crashed leader released nothing"
    last_renewal = renewed_at(lease)

    await candidates.wait_leader("pod-b", "pod-b takes over after the Lease expired")
    # pod-b measured leaseDurationSeconds on its own clock from the first time it saw that renewTime, which is
    # after pod-a wrote it: it cannot have started leading earlier than this.
    assert candidates.leadership.first("pod-b", "start") >= last_renewal + DURATION
    lease = await candidates.lease()
    assert lease["spec"]["holderIdentity"] == "pod-b" and lease["spec"]["leaseTransitions"] >= 1


@pytest.mark.parametrize("failure", ["refused", "unanswered"])
async def test_a_leader_that_cannot_renew_steps_down_within_the_renew_deadline(
    candidates: Candidates, failure: str
) -> None:
    relay = await candidates.relay()
    a = await candidates.start("pod-a", relay)
    await candidates.wait_leader("pod-a", "pod-a leads")
    await candidates.start("pod-b")
    await asyncio.sleep(2 * RETRY)

    cut = time.time()
    if failure == "refused":
        relay.refuse()
    else:
        relay.stall()  # the API server never answers pod-a's renewal: only the deadline can end it
    await poll(lambda: asyncio.sleep(0, not a.leading), "pod-a stepping down", limit=30)
    stepped_down = candidates.leadership.first("pod-a", "stop")
    last_renewal = renewed_at(await candidates.lease())
    assert last_renewal < cut + 1, "pod-a renewed nothing after it was cut off"
    # Within renew_deadline of its last renewal (plus one retry period), long before the Lease expires for
    # the others: no second leader can start while pod-a still leads.
    assert stepped_down < last_renewal + DURATION

    await candidates.wait_leader("pod-b", "pod-b takes over once the Lease expired")
    assert candidates.leadership.first("pod-b", "start") >= last_renewal + DURATION
    assert candidates.leadership.most_at_once() == 1, candidates.leadership.events


async def test_a_leader_whose_lease_was_taken_steps_down(candidates: Candidates) -> None:
    a = await candidates.start("pod-a")
    await candidates.wait_leader("pod-a", "pod-a leads")

    # Another holder writes the Lease (an operator, or a candidate that judged it expired).
    admin = await candidates.client()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{candidates.namespace}/leases/{LEASE}"
    lease = await admin.get_json(path)
    lease["spec"]["holderIdentity"] = "pod-z"
    lease["spec"]["renewTime"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease["spec"]["leaseDurationSeconds"] = 3600
    await admin.send_json("PUT", path, lease)

    await poll(lambda: asyncio.sleep(0, not a.leading), "pod-a stepping down", limit=30)
    await asyncio.sleep(4 * RETRY)  # pod-a keeps trying, as a follower, and must leave pod-z's Lease alone
    assert candidates.leadership.leading == [] and not a.leading
    assert (await candidates.lease())["spec"]["holderIdentity"] == "pod-z"


async def test_the_lease_belongs_to_the_workload_and_goes_with_it(
    candidates: Candidates, k8s_cluster: ClusterInfo, k8s_namespace: str
) -> None:
    """The Lease is made at run time, so ``helm uninstall`` cannot delete it: agentk makes the Deployment that
    runs it the Lease's owner (found from its pod through the ReplicaSet), and the garbage collector deletes
    the Lease with the Deployment."""
    admin = await candidates.client()
    labels = {"app": "agentk"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "agentk"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "a", "image": "x.invalid/a"}]},
            },
        },
    }
    created = await admin.send_json("POST", f"/apis/apps/v1/namespaces/{k8s_namespace}/deployments", deployment)

    async def pod_name() -> str:
        pods = await admin.get_json(f"/api/v1/namespaces/{k8s_namespace}/pods", {"labelSelector": "app=agentk"})
        return str(pods["items"][0]["metadata"]["name"]) if pods["items"] else ""

    pod = await poll(pod_name, "the Deployment's pod", limit=60, interval=0.2)
    owner = await workload_owner(admin, k8s_namespace, pod)
    assert owner == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "agentk", "uid": created["metadata"]["uid"]}
    assert await workload_owner(admin, k8s_namespace, "no-such-pod") is None  # logged, not raised

    elector = LeaderElector(admin, k8s_namespace, LEASE, pod, lease_duration_s=DURATION, owner=owner)
    task = asyncio.create_task(elector.run(candidates.leadership.lead(pod)))
    try:
        await candidates.wait_leader(pod, "the pod leads")
        assert (await candidates.lease())["metadata"]["ownerReferences"] == [owner]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await admin.send_json("DELETE", f"/apis/apps/v1/namespaces/{k8s_namespace}/deployments/agentk")

    async def lease_gone() -> bool:
        try:
            await candidates.lease()
        except KubeApiError as exc:
            return exc.status == 404
        return False

    await poll(lease_gone, "the garbage collector to delete the Lease with its owner", limit=60, interval=0.5)


@dataclass
class Replica:
    """One agentk replica's module set, built as agentk builds it (:func:`build_modules`)."""

    identity: str
    supervisor: ModuleSupervisor
    api: AgentApi
    modules: list[Any]


class _RecordingModule:
    """A module that records in ``leadership`` while it runs (started to stopped)."""

    def __init__(self, name: str, identity: str, leadership: Leadership) -> None:
        self.name = name
        self._identity = identity
        self._leadership = leadership
        self.started = 0

    async def start(self) -> None:
        self.started += 1
        self._leadership.leading.append(self._identity)
        self._leadership.events.append((time.time(), self._identity, "start"))

    async def stop(self) -> None:
        self._leadership.events.append((time.time(), self._identity, "stop"))
        self._leadership.leading.remove(self._identity)

    def is_runnable_configuration(self, configuration: agentcfg_pb2.AgentConfiguration) -> bool:
        return configuration.HasField("remote_development")


@dataclass
class _Factory:
    name: str
    leader_only: bool
    leadership: Leadership
    identity: str
    built: list[_RecordingModule] = field(default_factory=list)

    def new(self, api: AgentApi) -> _RecordingModule:
        module = _RecordingModule(self.name, self.identity, self.leadership)
        self.built.append(module)
        return module


async def _replica(candidates: Candidates, identity: str, everywhere: Leadership) -> Replica:
    supervisor = ModuleSupervisor("agentk")
    kube = await candidates.client()
    credentials = load_credentials(str(candidates.cluster.kubeconfig))
    api = AgentApi(kube, credentials, InternalServer(), supervisor.spawn, pod_namespace=candidates.namespace)
    api.pod_name = identity
    factories = [
        _Factory("everywhere", False, everywhere, identity),
        _Factory("leader", True, candidates.leadership, identity),
    ]
    modules = build_modules(factories, api)
    await supervisor.start(modules)
    return Replica(identity, supervisor, api, modules)


def _configure(replica: Replica, *, runnable: bool) -> None:
    configuration = agentcfg_pb2.AgentConfiguration(agent_id=1)
    if runnable:
        configuration.remote_development.enabled = True
    for callback in replica.api.configuration_callbacks:
        callback(configuration)


async def _stop(replica: Replica) -> None:
    await replica.supervisor.stop_modules()
    await replica.supervisor.cancel_loops()


async def test_a_leader_only_module_runs_only_on_the_leader(candidates: Candidates) -> None:
    """agentk's leader wrapper (issue 24 item 3): ``leader_only`` modules run on one replica, the others on all."""
    everywhere = Leadership()
    a = await _replica(candidates, "pod-a", everywhere)
    b = await _replica(candidates, "pod-b", everywhere)
    try:
        assert sorted(everywhere.leading) == ["pod-a", "pod-b"], "modules that are not leader_only run at once"
        # A configuration the leader-only module cannot run: nobody competes, no Lease is created.
        _configure(a, runnable=False)
        _configure(b, runnable=False)
        await asyncio.sleep(RETRY * 2)
        with pytest.raises(KubeApiError) as missing:
            await candidates.lease()
        assert missing.value.status == 404 and candidates.leadership.leading == []
        _configure(a, runnable=True)
        await candidates.wait_leader("pod-a", "pod-a's leader-only module runs")
        _configure(b, runnable=True)
        await asyncio.sleep(RETRY * 3)
        assert candidates.leadership.leading == ["pod-a"], "the follower's leader-only module must not run"
        assert (await candidates.lease())["spec"]["holderIdentity"] == "pod-a"
        await _stop(a)  # a clean stop releases the Lease: pod-b takes over at once
        await candidates.wait_leader("pod-b", "pod-b's leader-only module runs after pod-a stopped")
        assert candidates.leadership.most_at_once() == 1, candidates.leadership.events
    finally:
        await _stop(a)
        await _stop(b)
