"""A cluster with a real node (containerd, kubelet, kube-proxy, CoreDNS, local-path-provisioner) for tests/node.

Only the tests in this package start it (package scope, so it is gone before the rest of the suite goes on);
every other test keeps the kwok-only cluster of ``tests.fixtures.k8s``. Here ``k8s_cluster`` and ``kubectl``
are overridden, so the kas fixtures (``system`` reads ``k8s_cluster``) serve agentk the real-node cluster.
The teardown checks that nothing is left: processes, mounts under the cluster directory, the network
namespace, the host's iptables rules and the pod route.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.browser import browser
from tests.fixtures.k8s import Kubectl, cluster_assets
from tether_devenv import node_build, node_net
from tether_devenv.build import BuildError
from tether_devenv.cluster import ClusterInfo, LocalCluster
from tether_devenv.node import mounts_under, read_tunables
from tether_devenv.process import pid_alive

#: The console tests' Chromium (one definition, ``tests/console/browser.py``) for the editor test.
__all__ = ["browser"]


def _leftovers(info: ClusterInfo, directory: Path) -> list[str]:
    found = []
    record = info.real_nodes
    netns = set(node_net.run("ip", "netns", "list").stdout.split())
    routes = node_net.run("ip", "-4", "route", "show").stdout
    for node in record.get("nodes", []):
        net = node_net.NodeNet.from_json(node["net"])
        found += [f"process {name} ({pid})" for name, pid in node["pids"].items() if pid_alive(int(pid))]
        found += [f"host rule {rule}" for rule in node_net.host_rules(net.netns)]
        found += [f"network namespace {net.netns}"] if net.netns in netns else []
        found += [f"route {net.pod_cidr}"] if net.pod_cidr in routes else []
    found += [f"process {name} ({pid})" for name, pid in info.pids.items() if pid_alive(pid)]
    found += [f"mount {point}" for point in mounts_under(directory)]
    return found


@pytest.fixture(scope="package")
def real_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    """A running cluster with one kwok node (tainted) and one real node, DNS and a default StorageClass."""
    if os.geteuid() != 0:
        pytest.fail("the real node needs root (network namespaces, containerd, kubelet)", pytrace=False)
    cluster_assets()
    try:
        node_build.locate()
    except BuildError as exc:
        if os.environ.get("TETHER_SKIP_K8S") == "1":
            pytest.skip(str(exc))
        pytest.fail(str(exc), pytrace=False)
    directory = tmp_path_factory.mktemp("k8s-real")
    cluster = LocalCluster(directory, nodes=1, real_nodes=1)
    kernel = read_tunables()  # kubelet rewrites some host sysctls; the host gets its own back
    info = cluster.start()
    try:
        yield info
    finally:
        cluster.stop()
        left = _leftovers(info, directory)
        changed = {name: value for name, value in read_tunables().items() if kernel.get(name) != value}
        left += [f"sysctl {name} = {value} (was {kernel.get(name)})" for name, value in changed.items()]
        assert not left, f"the real node left: {left}"


@pytest.fixture(scope="package")
def k8s_cluster(real_node_cluster: ClusterInfo) -> ClusterInfo:
    """In tests/node the cluster is the real-node one."""
    return real_node_cluster


@pytest.fixture(scope="package")
def kubectl(real_node_cluster: ClusterInfo) -> Kubectl:
    """The real kubectl as cluster admin of the real-node cluster."""
    return Kubectl(cluster_assets()["kubectl"], real_node_cluster.kubeconfig)
