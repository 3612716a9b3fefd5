"""The real node's plan and configuration (tether_devenv.node_net, tether_devenv.node): pure logic."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
import yaml

from tether_devenv import node, node_net


def _net() -> node_net.NodeNet:
    return node_net.NodeNet("real-node-0", "trnabc0", "trhabc0", "trcabc0", "198.18.4.1", "198.18.4.2", "198.19.7.0/24")


@pytest.mark.skipif(os.geteuid() != 0 or (not os.path.exists("/usr/sbin/ip") and not os.path.exists("/sbin/ip")),
                    reason="reads the host's addresses with ip")  # fmt: skip
def test_plan_gives_distinct_ranges_in_benchmarking_space_and_short_names() -> None:
    nets = node_net.plan(3)
    links = [ipaddress.ip_interface(f"{n.node_address}/30").network for n in nets]
    pods = [ipaddress.ip_network(n.pod_cidr) for n in nets]
    ranges = links + pods
    assert all(a == b or not a.overlaps(b) for a in ranges for b in ranges)
    assert all(link.subnet_of(node_net.LINK_RANGE) for link in links)  # type: ignore[arg-type]
    assert all(pod.subnet_of(node_net.POD_RANGE) and pod.prefixlen == 24 for pod in pods)  # type: ignore[arg-type]
    assert [n.name for n in nets] == ["real-node-0", "real-node-1", "real-node-2"]
    assert all(len(name) <= 15 for n in nets for name in (n.netns, n.host_if, n.node_if))  # IFNAMSIZ


def test_net_round_trips_through_state_json() -> None:
    net = _net()
    assert node_net.NodeNet.from_json(net.to_json()) == net
    assert net.pod_gateway == "198.19.7.1"


def test_kubelet_keeps_webhook_authentication_and_authorisation(tmp_path: Path) -> None:
    config = node._kubelet_config(tmp_path, _net(), tmp_path / "ca.crt", (tmp_path / "s.crt", tmp_path / "s.key"))
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["webhook"] == {"enabled": True}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    # The settings this VM needs (../shared/reference/deployment.md §1).
    assert (config["cgroupDriver"], config["failCgroupV1"], config["cgroupsPerQOS"]) == ("cgroupfs", False, False)
    assert config["address"] == "198.18.4.2" and config["clusterDNS"] == [node.DNS_SERVICE_IP]
    assert config["podLogsDir"].startswith(str(tmp_path))


def test_containerd_is_confined_to_the_node_directory(tmp_path: Path) -> None:
    text = node._containerd_config(tmp_path, _net())
    assert "restrict_oom_score_adj = true" in text
    assert "netns_mounts_under_state_dir = true" in text
    for key in ("root", "state", "address", "Root", "conf_dir"):
        lines = [line for line in text.splitlines() if line.strip().startswith(f"{key} =")]
        assert lines and all(str(tmp_path) in line for line in lines), key
    assert "config_path" not in text and "mirrors" not in text  # registries keep containerd's defaults


def test_kube_proxy_masquerades_service_traffic_and_leaves_conntrack_alone(tmp_path: Path) -> None:
    config = node._kube_proxy_config(tmp_path / "kc", _net())
    assert config["mode"] == "iptables" and config["iptables"]["masqueradeAll"] is True
    assert config["conntrack"]["maxPerCore"] == 0
    yaml.safe_dump(config)


def test_mounts_under_lists_only_that_directory(tmp_path: Path) -> None:
    assert node.mounts_under(tmp_path) == []
    assert "/proc" in node.mounts_under(Path("/proc"))


def test_a_cluster_directory_too_deep_for_the_node_sockets_is_refused_with_the_room_left() -> None:
    """Before, kubelet exited half-way through the start ("bind: invalid argument" on its pod resources socket)."""
    node.check_socket_room(Path("/tmp/tu-abc/cluster"))
    deep = Path("/tmp/pytest-of-root/pytest-501/popen-gw1/tether-up0/state/cluster")
    with pytest.raises(node_net.NodeNetworkError, match=r"at most \d+ characters"):
        node.check_socket_room(deep)
