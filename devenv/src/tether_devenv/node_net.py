"""The host side of a real node's network: a network namespace per node, joined to the host by a veth pair.

Every node program (containerd, kubelet, kube-proxy, CoreDNS) runs in the node's own network namespace, so
its bridge, pod addresses and kube-proxy's iptables rules never touch the host's (other clusters, other
engineers' tests share this machine). The host reaches the node at its veth address (``/30`` in
198.18.0.0/16) and its pods through a route for the node's pod range (``/24`` in 198.19.0.0/16): RFC 2544
benchmarking space, which no real network uses; the choice avoids every address and route the host has.

The node reaches the API server, which listens on the host's loopback only, through one DNAT rule in the
host's ``nat`` table: TCP to the API address (the first node's host-side veth address) on the API port,
arriving on the node's veth, is sent to ``127.0.0.1``; ``route_localnet`` on that veth lets the kernel
route it there. A MASQUERADE rule lets the node's own traffic (image pulls) out when the host forwards.
Each rule carries the comment ``tether-node <netns>`` and is removed by its exact specification.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import secrets
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

from tether_devenv.process import EnvironmentProblem

LINK_RANGE = ipaddress.ip_network("198.18.0.0/16")
POD_RANGE = ipaddress.ip_network("198.19.0.0/16")
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


class NodeNetworkError(EnvironmentProblem):
    """A network set-up command failed; the message has the command and its error output."""


@dataclass(frozen=True)
class NodeNet:
    """One real node's addresses and interface names.

    Attributes:
        name: the Kubernetes node name (``real-node-<i>``).
        netns: the ``ip netns`` name (``trn<tag><i>``).
        host_if / node_if: the host's and the namespace's end of the veth pair.
        host_address / node_address: the two addresses of the pair's ``/30``; the node IP is ``node_address``.
        pod_cidr: the node's pod range (``/24``), served by the bridge and host-local IPAM.
    """

    name: str
    netns: str
    host_if: str
    node_if: str
    host_address: str
    node_address: str
    pod_cidr: str

    @property
    def netns_path(self) -> str:
        """The namespace's bind mount, for ``nsenter --net=``."""
        return f"/run/netns/{self.netns}"

    @property
    def pod_gateway(self) -> str:
        """The bridge's address, first of :attr:`pod_cidr`."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    def to_json(self) -> dict[str, str]:
        """Serialise for the cluster's ``state.json``."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeNet:
        """Read what :meth:`to_json` wrote."""
        return cls(**{k: str(data[k]) for k in cls.__dataclass_fields__})


def tool(name: str) -> str:
    """Absolute path of an administration tool (``ip``, ``iptables``, ...), also from ``/usr/sbin``."""
    found = shutil.which(name, path=_SBIN_PATH)
    if found is None:
        raise NodeNetworkError(f"`{name}` is not installed: run scripts/bootstrap.sh (Debian's packages)")
    return found


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an administration command (``args[0]`` resolved by :func:`tool`); raise on failure when ``check``."""
    result = subprocess.run([tool(args[0]), *args[1:]], capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        raise NodeNetworkError(f"{' '.join(args)} failed: {(result.stderr or result.stdout).strip()}")
    return result


def _taken() -> list[ipaddress.IPv4Network]:
    taken = []
    for word in run("ip", "-4", "-o", "addr", "show").stdout.split():
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+/\d+", word):
            taken.append(ipaddress.ip_interface(word).network)
    for line in run("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", first):
            taken.append(ipaddress.ip_network(first, strict=False))
    return [n for n in taken if isinstance(n, ipaddress.IPv4Network)]


def _pick(space: ipaddress.IPv4Network | ipaddress.IPv6Network, prefix: int, taken: list[ipaddress.IPv4Network]) -> str:
    count = 2 ** (prefix - space.prefixlen)
    for _ in range(200):
        base = ipaddress.ip_address(int(space.network_address) + random.randrange(count) * 2 ** (32 - prefix))
        subnet = ipaddress.ip_network(f"{base}/{prefix}")
        assert isinstance(subnet, ipaddress.IPv4Network)
        if not any(subnet.overlaps(other) for other in taken):
            taken.append(subnet)
            return str(subnet)
    raise NodeNetworkError(f"no free /{prefix} in {space}")


def plan(count: int) -> list[NodeNet]:
    """Choose names and free subnets for ``count`` nodes (nothing is created yet)."""
    tag = secrets.token_hex(3)
    taken = _taken()
    nets = []
    for index in range(count):
        link = ipaddress.ip_network(_pick(LINK_RANGE, 30, taken))
        host_address, node_address = (str(a) for a in list(link.hosts())[:2])
        nets.append(
            NodeNet(
                name=f"real-node-{index}",
                netns=f"trn{tag}{index}",
                host_if=f"trh{tag}{index}",
                node_if=f"trc{tag}{index}",
                host_address=host_address,
                node_address=node_address,
                pod_cidr=_pick(POD_RANGE, 24, taken),
            )
        )
    return nets


def _api_rule(net: NodeNet, api_address: str, api_port: int) -> list[str]:
    return [
        "PREROUTING",
        "-i",
        net.host_if,
        "-d",
        api_address,
        "-p",
        "tcp",
        "--dport",
        str(api_port),
        "-m",
        "comment",
        "--comment",
        f"tether-node {net.netns}",
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{api_port}",
    ]


def _egress_rule(net: NodeNet) -> list[str]:
    link = ipaddress.ip_interface(f"{net.node_address}/30").network
    return [
        "POSTROUTING",
        "-s",
        str(link),
        "!",
        "-o",
        net.host_if,
        "-m",
        "comment",
        "--comment",
        f"tether-node {net.netns}",
        "-j",
        "MASQUERADE",
    ]


def _loopback_guard(net: NodeNet) -> list[str]:
    """Drop what arrives on the veth for ``127.0.0.0/8`` unless the API rule made it so.

    ``route_localnet`` lets the kernel route to loopback from that veth; without this rule a pod with the host's
    network and ``NET_RAW`` could reach every loopback-only service of the host (kube-proxy's guard for
    CVE-2020-8558, the same situation).
    """
    return [
        "INPUT",
        "-i",
        net.host_if,
        "-d",
        "127.0.0.0/8",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "DNAT",
        "-m",
        "comment",
        "--comment",
        f"tether-node {net.netns}",
        "-j",
        "DROP",
    ]


def create(net: NodeNet, api_address: str, api_port: int) -> None:
    """Create the namespace, the veth pair, the routes and the three host rules for ``net``.

    Raises:
        NodeNetworkError: a command failed (what was created is removed again).
    """
    try:
        run("ip", "netns", "add", net.netns)
        run("ip", "link", "add", net.host_if, "type", "veth", "peer", "name", net.node_if, "netns", net.netns)
        run("ip", "addr", "add", f"{net.host_address}/30", "dev", net.host_if)
        run("ip", "link", "set", net.host_if, "up")
        run("ip", "route", "add", net.pod_cidr, "via", net.node_address, "dev", net.host_if)
        run("iptables", "-w", "-I", *_loopback_guard(net))
        run("sysctl", "-q", "-w", f"net.ipv4.conf.{net.host_if}.route_localnet=1")
        inside = ("nsenter", f"--net={net.netns_path}")
        run(*inside, tool("ip"), "link", "set", "lo", "up")
        run(*inside, tool("ip"), "addr", "add", f"{net.node_address}/30", "dev", net.node_if)
        run(*inside, tool("ip"), "link", "set", net.node_if, "up")
        run(*inside, tool("ip"), "route", "add", "default", "via", net.host_address)
        run(*inside, tool("sysctl"), "-q", "-w", "net.ipv4.ip_forward=1")
        run("iptables", "-w", "-t", "nat", "-A", *_api_rule(net, api_address, api_port))
        run("iptables", "-w", "-t", "nat", "-A", *_egress_rule(net))
    except BaseException:
        remove(net, api_address, api_port)
        raise


def remove(net: NodeNet, api_address: str, api_port: int) -> None:
    """Remove what :func:`create` made for ``net``; each step is skipped when already gone."""
    run("iptables", "-w", "-t", "nat", "-D", *_api_rule(net, api_address, api_port), check=False)
    run("iptables", "-w", "-t", "nat", "-D", *_egress_rule(net), check=False)
    run("iptables", "-w", "-D", *_loopback_guard(net), check=False)
    run("ip", "route", "del", net.pod_cidr, check=False)
    run("ip", "link", "del", net.host_if, check=False)
    run("ip", "netns", "del", net.netns, check=False)


def host_rules(netns: str) -> list[str]:
    """The host ``nat`` and ``filter`` rules that still carry ``netns``'s comment (for tests of the clean-up)."""
    listing = run("iptables", "-w", "-t", "nat", "-S").stdout.splitlines()
    listing += run("iptables", "-w", "-S").stdout.splitlines()
    return [line for line in listing if f"tether-node {netns}" in line]
