"""Real nodes for the development cluster: containerd + runc + kubelet + kube-proxy in a network namespace each.

What runs, and the settings this machine kind needs (``../shared/reference/deployment.md`` §1, learnt here
by hand; ``docs/deployment.md`` "The development cluster's real node" explains them for people):

- **containerd** (Debian) with its own ``root``, ``state``, socket and runc root under the node's directory;
  ``restrict_oom_score_adj`` (the VM withholds ``CAP_SYS_RESOURCE``: without it every sandbox fails), runc
  with cgroupfs (crun refuses hybrid cgroups), the sandbox image imported from a local archive
  (:mod:`tether_devenv.oci`), pod network namespaces under the state directory (so clean-up finds them), and
  the default registry configuration, so a node that can reach a registry pulls from it.
- **CNI**: ``bridge`` (gateway, IP masquerade, hairpin) + ``host-local`` on the node's ``/24`` + ``portmap``.
- **kubelet**: cgroupfs, ``failCgroupV1: false``, ``cgroupsPerQOS: false``, no node-allocatable
  enforcement, swap allowed, no image garbage collection (the local images cannot be pulled again), its
  node IP on the namespace's veth; webhook authentication and authorisation on, a serving certificate and
  a client certificate (``system:node:<name>``) signed by the cluster CA. The API server gets
  ``--kubelet-preferred-address-types=InternalIP``, a kubelet client certificate and the CA to check the
  kubelet, ``--authorization-mode=Node,RBAC`` and ``NodeRestriction`` (:func:`apiserver_args`).
- **kube-proxy** (iptables mode) in the node's namespace, ``masqueradeAll`` so that a pod reaching a Service
  whose backend is on the same bridge gets its answer back through the node, conntrack sysctls left alone.
- Cluster add-ons: **CoreDNS** in the first node's namespace on its node IP, behind the ``kube-dns`` Service
  (10.96.0.10); **local-path-provisioner** on the host with the default StorageClass ``local-path``; the
  ``kubernetes`` Service's endpoint, so pods reach the API server.

Processes are started with ``nsenter --net`` only (not ``ip netns exec``, whose private mount namespace and
remounted ``/sys`` would hide the host's cgroup mounts). :func:`teardown` removes everything by recorded pid,
path and name: containers, mounts under the cluster directory, the namespace, routes and host rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tether_devenv import node_net, oci
from tether_devenv import pki as pki_mod
from tether_devenv.kubeapi import ApiError, KubeApi
from tether_devenv.node_build import NodeBinaries
from tether_devenv.node_net import NodeNet
from tether_devenv.process import ManagedProcess, ProcessFailed, pid_alive, stop_pid

Progress = Callable[[str], None]
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
NODE_LABEL = "tether.dev/node"
CNI_BIN_DIR = "/usr/lib/cni"
LOCAL_PATH_NAMESPACE = "local-path-storage"
STORAGE_CLASS = "local-path"
START_TIMEOUT_S = 120.0
_ENV = dict(os.environ, PATH=os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"]))


def apiserver_args(pki_dir: Path, ca_file: Path) -> list[str]:
    """kube-apiserver flags a cluster with real nodes needs, writing the kubelet client certificate.

    Upstream's kubeadm layout: a client certificate for kube-apiserver -> kubelet in ``system:masters``,
    the CA that signed the kubelets' serving certificates, InternalIP first (the node has no DNS name), and
    the Node authoriser with the NodeRestriction admission plugin for the kubelets' own identities.
    """
    cert, key = pki_mod.issue(
        ca_file,
        pki_dir / "ca.key",
        pki_dir,
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        ("system:masters",),
    )
    return [
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={cert}",
        f"--kubelet-client-key={key}",
        f"--kubelet-certificate-authority={ca_file}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
    ]


def _kubeconfig(path: Path, server: str, ca_file: Path, user: dict[str, str]) -> Path:
    # The node reaches the API server at a host address through DNAT; the certificate names "kubernetes".
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority": str(ca_file), "tls-server-name": "kubernetes"},
            }
        ],
        "users": [{"name": "node", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "node"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


#: Bytes a unix socket path may hold on Linux (``sun_path`` is 108 with its terminating NUL).
_UNIX_PATH_MAX = 107
#: The deepest socket a node makes below the cluster directory: kubelet's pod resources endpoint.
_DEEPEST_SOCKET = "nodes/real-node-00/kubelet/pod-resources/1234567890"


def check_socket_room(directory: Path) -> None:
    """Refuse a cluster directory too deep for the sockets its nodes create (containerd's, kubelet's).

    Without this check kubelet or containerd exits with "bind: invalid argument" or "unix socket path too
    long" half-way through the start.

    Raises:
        tether_devenv.node_net.NodeNetworkError: ``directory`` is longer than the sockets allow; says by how much.
    """
    deepest = len(str(directory.absolute() / _DEEPEST_SOCKET))
    if deepest > _UNIX_PATH_MAX:
        room = len(str(directory.absolute())) - (deepest - _UNIX_PATH_MAX)
        raise node_net.NodeNetworkError(
            f"the cluster directory {directory} is too deep for the real node's unix sockets: use a state "
            f"directory whose cluster directory has at most {room} characters (e.g. --state-dir under /tmp)"
        )


def _containerd_config(directory: Path, net: NodeNet) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{directory / "containerd" / "root"}"
state = "{directory / "containerd" / "state"}"

[grpc]
  address = "{directory / "containerd.sock"}"

[ttrpc]
  address = "{directory / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{directory / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{oci.PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{node_net.tool("runc")}"
  Root = "{directory / "containerd" / "runc"}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{directory / "cni" / "net.d"}"
"""


def _cni_config(directory: Path, net: NodeNet) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "tether",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.pod_cidr, "gateway": net.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(directory / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _kubelet_config(directory: Path, net: NodeNet, ca_file: Path, serving: tuple[Path, Path]) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": net.node_address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        "containerRuntimeEndpoint": f"unix://{directory / 'containerd.sock'}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        "podLogsDir": str(directory / "pod-logs"),
        "volumePluginDir": str(directory / "volume-plugins"),
        # The local images cannot be pulled again: never collect them, and keep pods on a full disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "maxPods": 110,
        "rotateCertificates": False,
    }


def _kube_proxy_config(kubeconfig: Path, net: NodeNet) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": net.name,
        "clusterCIDR": net.pod_cidr,
        "healthzBindAddress": f"{net.node_address}:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "oomScoreAdj": 0,
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "10s", "minSyncPeriod": "1s"},
        # nf_conntrack_max is global and the VM withholds CAP_SYS_RESOURCE: leave every conntrack sysctl alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
    }


def _corefile(net: NodeNet, kubeconfig: Path) -> str:
    # No `forward`: these machines have no resolver that pods may use; cluster names are what tests need.
    return f""".:53 {{
    bind {net.node_address}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def _helper_pod() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "helper-pod"},
            "spec": {
                "containers": [{"name": "helper-pod", "image": oci.BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent"}]
            },
        }
    )


#: Host-wide sysctls kubelet rewrites at start (its ``setupKernelTunables``: overcommit, panic on oops...).
#: ``protectKernelDefaults`` would make kubelet refuse to start instead, so they are saved before the first
#: kubelet and written back when the nodes go: a developer's machine keeps its own settings.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def read_tunables() -> dict[str, str]:
    """The current value of each of :data:`KERNEL_TUNABLES` that this kernel has, ``name -> text``."""
    found = {}
    for name in KERNEL_TUNABLES:
        with contextlib.suppress(OSError):
            found[name] = (Path("/proc/sys") / name).read_text().strip()
    return found


def restore_tunables(saved: dict[str, str]) -> None:
    """Write back values read by :func:`read_tunables` (one that cannot be written is left as it is)."""
    for name, value in saved.items():
        if name in KERNEL_TUNABLES:
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)


@dataclass
class RealNodes:
    """Starts ``count`` real nodes and the cluster add-ons that need them; stops and removes them all.

    Args:
        directory: the cluster's directory; each node lives in ``nodes/<name>/``.
        count: number of real nodes (>= 1).
        pki: the cluster's PKI (its CA signs the node certificates).
        api_port: the API server's port on the host's loopback.
        admin_kubeconfig: the host's admin kubeconfig (for local-path-provisioner).
        binaries: kubelet, kube-proxy, CoreDNS, local-path-provisioner.
        progress: one line per step.
    """

    directory: Path
    count: int
    pki: pki_mod.ClusterPki
    api_port: int
    admin_kubeconfig: Path
    binaries: NodeBinaries
    progress: Progress
    nets: list[NodeNet] = field(default_factory=list)
    processes: dict[str, list[ManagedProcess]] = field(default_factory=dict)
    host_processes: list[ManagedProcess] = field(default_factory=list)
    tunables: dict[str, str] = field(default_factory=dict)

    @property
    def api_address(self) -> str:
        """The address nodes and pods use for the API server: the first node's host-side veth address."""
        return self.nets[0].host_address

    def record(self) -> dict[str, Any]:
        """What :func:`teardown` needs, for the cluster's ``state.json``."""
        return {
            "api_port": self.api_port,
            "api_address": self.api_address if self.nets else "",
            "kernel_tunables": self.tunables,
            "nodes": [
                {
                    "net": net.to_json(),
                    "directory": str(self._node_dir(net)),
                    "pids": {p.name.split("@")[0]: p.pid for p in self.processes.get(net.name, []) if p.popen},
                }
                for net in self.nets
            ],
        }

    def all_processes(self) -> list[ManagedProcess]:
        """Every started process (node programs and host add-ons), for liveness checks."""
        return [p for procs in self.processes.values() for p in procs] + self.host_processes

    def _node_dir(self, net: NodeNet) -> Path:
        return self.directory / "nodes" / net.name

    def _spawn(
        self, net: NodeNet | None, name: str, args: list[str], probe: Callable[[], bool] | None, what: str
    ) -> None:
        started = time.monotonic()
        # nsenter joins the network namespace only, then execs the program: the recorded pid is the program's.
        argv = [node_net.tool("nsenter"), f"--net={net.netns_path}", "--", *args] if net else args
        label = f"{name}@{net.name}" if net else name
        proc = ManagedProcess(name=label, args=argv, log_path=self.directory / "logs" / f"{label}.log", env=_ENV)
        if net:
            self.processes.setdefault(net.name, []).append(proc)
        else:
            self.host_processes.append(proc)
        proc.start()
        if probe is not None:
            proc.wait_ready(probe, START_TIMEOUT_S, what)
        else:
            time.sleep(0.5)
            proc.check_alive()
        self.progress(f"  {label} {what} ({time.monotonic() - started:.1f}s, pid {proc.pid})")

    def start(self, api: KubeApi) -> None:
        """Create the networks, start every node, then the DNS and storage add-ons; wait until usable.

        Raises:
            tether_devenv.node_net.NodeNetworkError: a network command failed.
            tether_devenv.process.ProcessFailed: a program exited or did not become ready (with its log tail).
            tether_devenv.oci.ImageError: busybox-static is missing.
            tether_devenv.node_net.NodeNetworkError: the directory is too deep for the node's unix sockets.
        """
        check_socket_room(self.directory)
        self.tunables = read_tunables()
        self.nets = node_net.plan(self.count)
        images = self.directory / "images" / "node-images.tar"
        oci.write_node_images(images)
        for net in self.nets:
            node_net.create(net, self.api_address, self.api_port)
            self._start_node(net, images, api)
        self._start_dns(api)
        self._start_storage(api)

    def _start_node(self, net: NodeNet, images: Path, api: KubeApi) -> None:
        began = time.monotonic()
        directory = self._node_dir(net)
        for sub in ("cni/net.d", "cni/ipam", "containerd", "kubelet", "pod-logs", "volume-plugins", "pki"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        config = directory / "containerd.toml"
        config.write_text(_containerd_config(directory, net))
        (directory / "cni" / "net.d" / "10-tether.conflist").write_text(
            json.dumps(_cni_config(directory, net), indent=2)
        )
        socket_path = directory / "containerd.sock"
        ctr = [node_net.tool("ctr"), f"--address={socket_path}", "--namespace=k8s.io"]

        def containerd_up() -> bool:
            return subprocess.run([*ctr, "version"], capture_output=True, timeout=10, check=False).returncode == 0

        self._spawn(net, "containerd", [node_net.tool("containerd"), f"--config={config}"], containerd_up, "serving")
        node_net.run(*ctr, "images", "import", str(images))

        server = f"https://{self.api_address}:{self.api_port}"
        pki_dir = directory / "pki"
        serving = pki_mod.issue(
            self.pki.ca_cert,
            self.pki.ca_key,
            pki_dir,
            "kubelet-serving",
            net.name,
            ips=(net.node_address,),
            server=True,
        )
        client = pki_mod.issue(
            self.pki.ca_cert, self.pki.ca_key, pki_dir, "kubelet-client", f"system:node:{net.name}", ("system:nodes",)
        )
        kubelet_kubeconfig = _kubeconfig(
            directory / "kubelet.kubeconfig",
            server,
            self.pki.ca_cert,
            {"client-certificate": str(client[0]), "client-key": str(client[1])},
        )
        kubelet_config = directory / "kubelet.yaml"
        kubelet_config.write_text(yaml.safe_dump(_kubelet_config(directory, net, self.pki.ca_cert, serving)))
        self._spawn(
            net,
            "kubelet",
            [
                str(self.binaries.kubelet),
                f"--config={kubelet_config}",
                f"--kubeconfig={kubelet_kubeconfig}",
                f"--root-dir={directory / 'kubelet'}",
                f"--cert-dir={pki_dir}",
                f"--node-ip={net.node_address}",
                f"--hostname-override={net.name}",
                f"--node-labels={NODE_LABEL}=real",
                "--v=1",
            ],
            lambda: _node_ready(api, net.name),
            "registered a Ready node",
        )
        proxy = pki_mod.issue(self.pki.ca_cert, self.pki.ca_key, pki_dir, "kube-proxy", "system:kube-proxy")
        proxy_kubeconfig = _kubeconfig(
            directory / "kube-proxy.kubeconfig",
            server,
            self.pki.ca_cert,
            {"client-certificate": str(proxy[0]), "client-key": str(proxy[1])},
        )
        proxy_config = directory / "kube-proxy.yaml"
        proxy_config.write_text(yaml.safe_dump(_kube_proxy_config(proxy_kubeconfig, net)))
        self._spawn(
            net,
            "kube-proxy",
            [str(self.binaries.kube_proxy), f"--config={proxy_config}", "--v=1"],
            lambda: _http_ok(f"http://{net.node_address}:10256/healthz"),
            "healthy",
        )
        self.progress(
            f"  {net.name} ready at {net.node_address}, pods {net.pod_cidr} ({time.monotonic() - began:.1f}s)"
        )

    def _start_dns(self, api: KubeApi) -> None:
        net = self.nets[0]
        directory = self._node_dir(net)
        # The API server listens on the host's loopback; pods reach it as the `kubernetes` Service through DNAT.
        _endpoints(api, "default", "kubernetes", self.api_address, [("https", self.api_port, "TCP")])
        _apply(
            api,
            "/api/v1/namespaces/kube-system/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                    ],
                },
            },
        )
        _endpoints(api, "kube-system", "kube-dns", net.node_address, [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")])
        kubeconfig = _kubeconfig(
            directory / "coredns.kubeconfig",
            f"https://{self.api_address}:{self.api_port}",
            self.pki.ca_cert,
            {"token": self.pki.admin_token},
        )
        corefile = directory / "Corefile"
        corefile.write_text(_corefile(net, kubeconfig))
        self._spawn(
            net,
            "coredns",
            [str(self.binaries.coredns), "-conf", str(corefile), "-dns.port", "53"],
            lambda: _tcp_open(net.node_address, 53),
            f"serving {CLUSTER_DOMAIN} at {net.node_address}:53",
        )

    def _start_storage(self, api: KubeApi) -> None:
        storage = self.directory / "local-path"
        storage.mkdir(parents=True, exist_ok=True)
        namespace = LOCAL_PATH_NAMESPACE
        _apply(api, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        _apply(
            api,
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "local-path-provisioner-service-account"},
            },
        )
        _apply(
            api,
            f"/api/v1/namespaces/{namespace}/configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "local-path-config"},
                "data": {
                    "config.json": json.dumps(
                        {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [str(storage)]}]}
                    ),
                    "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                    "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                    "helperPod.yaml": _helper_pod(),
                },
            },
        )
        _apply(
            api,
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "rancher.io/local-path",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            },
        )
        self._spawn(
            None,
            "local-path-provisioner",
            [
                str(self.binaries.local_path_provisioner),
                "start",
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--namespace={namespace}",
                f"--helper-image={oci.BUSYBOX_IMAGE}",
            ],
            None,
            f"provisioning StorageClass {STORAGE_CLASS} (default) under {storage}",
        )

    def import_image(self, archive: Path) -> None:
        """Load an OCI archive (``make images``) into every node's containerd, as a registry pull would.

        Raises:
            tether_devenv.node_net.NodeNetworkError: ``ctr images import`` failed (with its error output).
        """
        import_archives(self.record(), [archive])

    def stop(self) -> None:
        """Stop the add-ons and every node, and remove their containers, mounts and networks."""
        for proc in reversed(self.host_processes):
            proc.stop()
        teardown_recorded(self.record())
        self.processes.clear()
        self.host_processes.clear()
        self.nets = []


def _node_ready(api: KubeApi, name: str) -> bool:
    node = api.request("GET", f"/api/v1/nodes/{name}", timeout=5.0)
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2.0) as response:
        return bool(response.status == 200)


def _tcp_open(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1.0):
        return True
    return False


def _apply(api: KubeApi, collection: str, body: dict[str, Any]) -> None:
    try:
        api.request("POST", collection, body)
    except ApiError as exc:
        if exc.status != 409:
            raise


def _endpoints(api: KubeApi, namespace: str, service: str, address: str, ports: list[tuple[str, int, str]]) -> None:
    _apply(
        api,
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{service}-real-node",
                "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "tether"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": name, "port": port, "protocol": protocol} for name, port, protocol in ports],
        },
    )


def _ctr(socket_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node_net.tool("ctr"), f"--address={socket_path}", "--namespace=k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def import_archives(record: dict[str, Any], archives: list[Path]) -> None:
    """Import OCI archives into the containerd of every node of a cluster's recorded ``real_nodes`` entry.

    The archives: ``make images``' kas, agentk and hub, :func:`tether_devenv.oci.write_redis_image`'s Redis.
    The node imports only its own pause and busybox images at start; charts' images come this way where no
    registry is reachable (pods then run them with ``imagePullPolicy: IfNotPresent``). Importing an image
    that is already there is quick and changes nothing.

    Raises:
        tether_devenv.node_net.NodeNetworkError: ``ctr images import`` failed (its message).
    """
    for node in record.get("nodes", []):
        socket_path = Path(node["directory"]) / "containerd.sock"
        for archive in archives:
            # Unpacking a few hundred MiB (the editor's tools image) takes minutes under load: a bound above it.
            result = _ctr(socket_path, "images", "import", str(archive), timeout=600)
            if result.returncode != 0:
                raise node_net.NodeNetworkError(f"ctr images import {archive} failed: {result.stderr.strip()}")


def _stop_recorded_pid(pid: int, binary: str) -> None:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return
    if Path(argv0).name == binary:  # a recycled pid of another program is left alone
        stop_pid(pid)


def _shims(socket_path: Path) -> list[int]:
    """Pids of containerd-shim processes started by the containerd listening on ``socket_path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and Path(argv[0].decode(errors="replace")).name.startswith("containerd-shim")
            and (str(socket_path).encode() in argv)
        ):
            found.append(int(entry.name))
    return found


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` in this mount namespace, deepest first."""
    prefix = str(directory.resolve())
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                point = fields[4].encode().decode("unicode_escape")
                if point == prefix or point.startswith(prefix + "/"):
                    points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_under(directory: Path) -> None:
    """Unmount everything below ``directory`` (tmpfs volumes, overlay root filesystems, pod netns files)."""
    for _ in range(3):
        points = mounts_under(directory)
        if not points:
            return
        for point in points:
            if node_net.run("umount", point, check=False).returncode != 0:
                node_net.run("umount", "-l", point, check=False)


def teardown(node: dict[str, Any], api_address: str, api_port: int) -> None:
    """Remove one recorded node: its pods' containers, its programs, mounts, namespace and host rules.

    ``node`` is an entry of :meth:`RealNodes.record` (``net``, ``directory``, ``pids``). Every step is
    idempotent, so a second call (or one after a crash) finishes what is left.
    """
    net = NodeNet.from_json(node["net"])
    directory = Path(node["directory"])
    try:
        _stop_node_programs(node, directory)
    finally:  # a hung containerd or runc must not leave the host's rules, routes and namespace behind
        unmount_under(directory)
        node_net.remove(net, api_address, api_port)
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and str(os.readlink(link)).startswith(str(directory)):
                    link.unlink()
    shutil.rmtree(directory / "containerd", ignore_errors=True)


def _stop_node_programs(node: dict[str, Any], directory: Path) -> None:
    """Stop a recorded node's programs and kill its containers (through containerd, else runc's state)."""
    pids: dict[str, int] = {k: int(v) for k, v in node["pids"].items()}
    socket_path = directory / "containerd.sock"
    for name in ("coredns", "kube-proxy", "kubelet"):
        if name in pids:
            _stop_recorded_pid(pids[name], name)
    containerd_pid = pids.get("containerd")
    if containerd_pid and pid_alive(containerd_pid):
        tasks = _ctr(socket_path, "tasks", "ls", "-q").stdout.split()
        for task in tasks:
            _ctr(socket_path, "tasks", "kill", "--all", "--signal", "SIGKILL", task)
        if tasks:
            _ctr(socket_path, "tasks", "rm", "--force", *tasks)
        _stop_recorded_pid(containerd_pid, "containerd")
    # Containers whose containerd is gone (crashed, killed) are still runc's: kill them through its state directory.
    runc = [node_net.tool("runc"), f"--root={directory / 'containerd' / 'runc' / 'k8s.io'}"]
    for container in node_net.run(*runc, "list", "-q", check=False).stdout.split():
        node_net.run(*runc, "delete", "--force", container, check=False)
    for pid in _shims(socket_path):
        stop_pid(pid, timeout=2.0)


def teardown_recorded(record: dict[str, Any]) -> list[str]:
    """Tear down every node of a cluster's recorded ``real_nodes`` entry; return the node names."""
    names = []
    failed: list[Exception] = []
    for node in record.get("nodes", []):
        try:
            teardown(node, record["api_address"], int(record["api_port"]))
        except Exception as exc:  # the other nodes still go; the first failure is raised at the end
            failed.append(exc)
        names.append(node["net"]["name"])
    restore_tunables(record.get("kernel_tunables", {}))
    if failed:
        raise failed[0]
    return names


__all__ = [
    "ProcessFailed",
    "RealNodes",
    "apiserver_args",
    "import_archives",
    "teardown",
    "teardown_recorded",
    "unmount_under",
]
