"""Fixtures of the interop tests: the upstream binaries (built once per machine) and a wired-up environment."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.hub import HubLauncher
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import KasProc, System
from tests.interop.harness import AGENT, Interop, UpstreamKas
from tether_devenv import pki, upstream
from tether_devenv.build import BuildError
from tether_devenv.cluster import ClusterInfo
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer

Factory = Callable[[str], tuple[Interop, KasProc | UpstreamKas]]


@pytest.fixture(scope="session")
def upstream_bins() -> upstream.UpstreamBinaries:
    """Upstream kas, agentk and glab; built from ../shared/upstream on first use (minutes), then cached."""
    if upstream.cache_problem() is not None:
        if os.environ.get("TETHER_SKIP_UPSTREAM") == "1":
            pytest.skip("upstream binaries not built and TETHER_SKIP_UPSTREAM=1")
        try:
            upstream.build()
        except BuildError as exc:
            pytest.fail(str(exc), pytrace=False)
    return upstream.locate()


@pytest.fixture
def interop_env(
    tmp_path: Path,
    upstream_bins: upstream.UpstreamBinaries,
    k8s_cluster: ClusterInfo,
    kubectl: Kubectl,
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
) -> Iterator[Factory]:
    """``interop_env("tether" | "upstream")``: the hub, a kas of that kind wired to it, an agent and a user."""
    made: list[tuple[Interop, HubLauncher]] = []

    def make(kind: str) -> tuple[Interop, KasProc | UpstreamKas]:
        (tmp_path / "hub").mkdir()
        (tmp_path / "system").mkdir()
        launcher = HubLauncher(tmp_path / "hub", f"sqlite+aiosqlite:///{tmp_path / 'hub' / 'hub.db'}")
        hub = launcher.prepare()
        system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server, proxy_tls)  # type: ignore[arg-type]
        env = Interop(
            tmp_path,
            upstream_bins,
            launcher,
            hub,
            system,
            redis_server,
            proxy_tls,
            k8s_cluster.kubeconfig,
            kubectl.binary,
        )
        made.append((env, launcher))
        kas: KasProc | UpstreamKas = env.tether_kas() if kind == "tether" else env.upstream_kas()
        api = f"127.0.0.1:{kas.ports['api']}"
        launcher.start(
            hub,
            {
                "kas.api_address": api,
                "kas.external_url": kas.agent_address,
                "kas.k8s_proxy_url": kas.k8s_proxy_url,
                "gitaly.listen": f"127.0.0.1:{free_port()}",
            },
        )
        admin = hub.api()
        group = admin.post("/groups", json={"name": "Platform", "path": "platform"}).json()
        project = admin.post("/projects", json={"name": "clusters", "namespace_id": group["id"]}).json()
        agent = admin.post(f"/projects/{project['id']}/cluster_agents", json={"name": AGENT}).json()
        tokens = f"/projects/{project['id']}/cluster_agents/{agent['id']}/tokens"
        env.agent_token = admin.post(tokens, json={"name": "agentk"}).json()["token"]
        env.agent_id, env.project_id = agent["id"], project["id"]
        user_id, _ = hub.user("dev")
        member = admin.post(f"/projects/{project['id']}/members", json={"user_id": user_id, "access_level": 30})
        assert member.status_code == 201, member.text
        env.user_token = hub.token_for(user_id, ("k8s_proxy",))
        return env, kas

    try:
        yield make
    finally:
        for env, launcher in made:
            env.stop()
            launcher.stop_all()
