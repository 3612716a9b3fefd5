"""A real local Kubernetes cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok.

Start order, flags and readiness checks follow ``../shared/reference/k8s_testenv.md`` §3-5: etcd
(``/health``) -> kube-apiserver (``/readyz``) -> controller manager -> scheduler -> kwok, then fake
nodes that kwok keeps Ready, so Deployments get ReplicaSets and Pods that are bound and marked Running.
TLS everywhere clients connect, a static admin token, and RBAC enabled, as in a real cluster.

With ``real_nodes`` > 0 the cluster also gets real nodes (:mod:`tether_devenv.node`: containerd, kubelet,
kube-proxy, CoreDNS, local-path-provisioner) that run containers. kwok then manages only the nodes it was
given (annotation ``kwok.x-k8s.io/node=fake``, its node selector option) and those carry kwok's
``kwok.x-k8s.io/node=fake:NoSchedule`` taint, upstream's advice, so that ordinary pods land on a real node.

The state file (``state.json`` in the cluster directory) records pids and endpoints, so another process
(``tether dev cluster down``) can stop exactly these processes.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tether_devenv import node_build
from tether_devenv import pki as pki_mod
from tether_devenv.assets import Assets, locate
from tether_devenv.kubeapi import ApiError, KubeApi
from tether_devenv.kwok_failures import stage_files
from tether_devenv.node import RealNodes, apiserver_args, teardown_recorded
from tether_devenv.process import (
    EnvironmentProblem,
    ManagedProcess,
    ensure_port_free,
    free_port,
    free_ports,
    pid_alive,
    stop_pid,
)

Progress = Callable[[str], None]
STATE_FILE = "state.json"
START_TIMEOUT_S = 60.0
#: Fake nodes advertise generous capacity so that thousands of pods fit (benchmarks create 5,000).
NODE_CAPACITY = {"cpu": "1000", "memory": "1Ti", "pods": "10000"}


@dataclass(frozen=True)
class ClusterInfo:
    """How to reach a running cluster.

    Attributes:
        directory: the cluster's state directory (PKI, logs, etcd data, kubeconfig).
        server: API server URL (``https://127.0.0.1:<port>``).
        token: admin bearer token (group ``system:masters``).
        ca_file: CA certificate that signed the API server's certificate.
        kubeconfig: path of an admin kubeconfig.
        pids: component name to pid, in start order.
        real_nodes: what :func:`tether_devenv.node.teardown_recorded` needs to remove the real nodes
            (empty without real nodes).
    """

    directory: Path
    server: str
    token: str
    ca_file: Path
    kubeconfig: Path
    pids: dict[str, int] = field(default_factory=dict)
    real_nodes: dict[str, Any] = field(default_factory=dict)

    @property
    def api(self) -> KubeApi:
        """A synchronous admin client for this cluster."""
        return KubeApi(self.server, self.token, self.ca_file)

    def to_json(self) -> dict[str, Any]:
        """Serialise for ``state.json``."""
        return {
            "server": self.server,
            "token": self.token,
            "ca_file": str(self.ca_file),
            "kubeconfig": str(self.kubeconfig),
            "pids": self.pids,
            "real_nodes": self.real_nodes,
        }

    @classmethod
    def load(cls, directory: Path) -> ClusterInfo | None:
        """Read ``directory/state.json``; None when absent or unreadable."""
        try:
            data = json.loads((directory / STATE_FILE).read_text())
            return cls(
                directory=directory,
                server=data["server"],
                token=data["token"],
                ca_file=Path(data["ca_file"]),
                kubeconfig=Path(data["kubeconfig"]),
                pids={k: int(v) for k, v in data["pids"].items()},
                real_nodes=data.get("real_nodes") or {},
            )
        except (OSError, ValueError, KeyError):
            return None

    def running(self) -> bool:
        """True when every recorded process is alive and the API server answers ``/readyz``."""
        return all(pid_alive(p) for p in self.pids.values()) and self.api.ok("/readyz")

    def rss_mib(self) -> float:
        """Total resident memory of the cluster's processes in MiB (from ``/proc/<pid>/status``)."""
        total_kib = 0
        for pid in self.pids.values():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total_kib += int(line.split()[1])
            except OSError:
                continue
        return total_kib / 1024


def write_kubeconfig(path: Path, server: str, token: str, ca_file: Path | None, name: str = "tether-dev") -> None:
    """Write a kubeconfig with one cluster, user and context named ``name`` (file mode 0600).

    ``ca_file`` is the CA of an ``https`` server, None for a plain ``http`` one.
    """
    cluster: dict[str, str] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority"] = str(ca_file)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


class LocalCluster:
    """Starts and stops one local cluster in ``directory`` (wiped on start).

    Args:
        directory: state directory; everything the cluster writes goes below it.
        nodes: number of kwok fake nodes (at least 1 without real nodes, may be 0 with them).
        api_port: fixed API server port, or None for a free one.
        assets: binaries to use; default :func:`tether_devenv.assets.locate`.
        progress: receives one human-readable line per start-up step.
        extra_apiserver_args: appended to kube-apiserver's flags (e.g. a shorter compaction interval).
        real_nodes: number of real nodes that run containers (:mod:`tether_devenv.node`); 0 for none.
    """

    def __init__(
        self,
        directory: Path,
        nodes: int = 1,
        api_port: int | None = None,
        assets: Assets | None = None,
        progress: Progress | None = None,
        extra_apiserver_args: tuple[str, ...] = (),
        real_nodes: int = 0,
    ) -> None:
        self.directory = directory
        self.real_nodes = max(0, real_nodes)
        self.nodes = max(0 if self.real_nodes else 1, nodes)
        self.api_port = api_port
        self.assets = assets
        self.progress: Progress = progress or (lambda _msg: None)
        self.extra_apiserver_args = extra_apiserver_args
        self.processes: list[ManagedProcess] = []
        self.real: RealNodes | None = None
        self.info: ClusterInfo | None = None

    def all_processes(self) -> list[ManagedProcess]:
        """Every process of the cluster: the control plane's, then the real nodes' and their add-ons'."""
        return self.processes + (self.real.all_processes() if self.real else [])

    def _spawn(self, name: str, args: list[str], probe: Callable[[], bool] | None, what: str) -> ManagedProcess:
        started = time.monotonic()
        proc = ManagedProcess(name=name, args=args, log_path=self.directory / "logs" / f"{name}.log")
        proc.start()
        self.processes.append(proc)
        if probe is not None:
            proc.wait_ready(probe, START_TIMEOUT_S, what)
        else:
            time.sleep(0.3)
            proc.check_alive()
        self.progress(f"  {name} {what} ({time.monotonic() - started:.1f}s, pid {proc.pid})")
        return proc

    def start(self) -> ClusterInfo:
        """Start every component and wait until the cluster can run pods; return how to reach it.

        Raises:
            tether_devenv.assets.AssetsMissing: binaries are not built (message says how to build them).
            tether_devenv.process.PortInUse: a fixed ``api_port`` is taken.
            tether_devenv.process.ProcessFailed: a component exited or never became ready (with its log tail).
            tether_devenv.build.BuildError: real nodes were asked for and their binaries are not built.
            tether_devenv.node_net.NodeNetworkError: a real node's network could not be set up.
        """
        assets = self.assets or locate()
        if self.real_nodes:
            node_build.locate()
        if self.api_port is not None:
            ensure_port_free(self.api_port, owner="kube-apiserver")
        try:
            return self._start(assets)
        except BaseException:
            self.stop()
            raise

    def _start(self, assets: Assets) -> ClusterInfo:
        began = time.monotonic()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        pki = pki_mod.generate(self.directory / "pki")
        etcd_port, peer_port = free_ports(2)
        api_port = self.api_port or free_port()
        server = f"https://127.0.0.1:{api_port}"
        api = KubeApi(server, pki.admin_token, pki.ca_cert)
        kubeconfig = self.directory / "admin.kubeconfig"
        write_kubeconfig(kubeconfig, server, pki.admin_token, pki.ca_cert)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        node_args = apiserver_args(self.directory / "pki", pki.ca_cert) if self.real_nodes else []
        authorization = [] if self.real_nodes else ["--authorization-mode=RBAC"]

        self._spawn(
            "etcd",
            [
                str(assets["etcd"]),
                "--name=default",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            lambda: KubeApi(etcd_url, "", pki.ca_cert).request("GET", "/health", timeout=1.0)["health"] == "true",
            "healthy",
        )
        self._spawn(
            "kube-apiserver",
            [
                str(assets["kube-apiserver"]),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={self.directory / 'pki'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--token-auth-file={pki.token_file}",
                *authorization,
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *node_args,
                *self.extra_apiserver_args,
            ],
            lambda: api.ok("/readyz"),
            "ready",
        )
        manager_kubeconfig = str(kubeconfig)
        self._spawn(
            "kube-controller-manager",
            [
                str(assets["kube-controller-manager"]),
                f"--kubeconfig={manager_kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=*",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--v=1",
            ],
            None,
            "started",
        )
        self._spawn(
            "kube-scheduler",
            [
                str(assets["kube-scheduler"]),
                f"--kubeconfig={manager_kubeconfig}",
                f"--authentication-kubeconfig={manager_kubeconfig}",
                f"--authorization-kubeconfig={manager_kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
            None,
            "started",
        )
        self._spawn(
            "kwok",
            [
                str(assets["kwok"]),
                f"--kubeconfig={manager_kubeconfig}",
                # With real nodes kwok must leave them (and their pods) to their kubelets.
                *(
                    ["--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake"]
                    if self.real_nodes
                    else ["--manage-all-nodes=true"]
                ),
                "--cidr=10.244.0.0/16",
                "--node-ip=10.244.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
                f"--config={','.join(str(s) for s in stage_files(assets.stages, self.directory / 'kwok'))}",
            ],
            None,
            "started",
        )
        self._create_nodes(api)
        if self.real_nodes:
            self.progress(f"starting {self.real_nodes} real node(s)")
            self.real = RealNodes(
                directory=self.directory,
                count=self.real_nodes,
                pki=pki,
                api_port=api_port,
                admin_kubeconfig=kubeconfig,
                binaries=node_build.locate(),
                progress=self.progress,
            )
            try:
                self.real.start(api)
            finally:
                self._write_state(server, pki, kubeconfig)  # a failed start is still torn down by `down`
        self._write_state(server, pki, kubeconfig)
        self.progress(f"cluster ready in {time.monotonic() - began:.1f}s")
        assert self.info is not None
        return self.info

    def _write_state(self, server: str, pki: pki_mod.ClusterPki, kubeconfig: Path) -> None:
        host = self.real.host_processes if self.real else []
        self.info = ClusterInfo(
            directory=self.directory,
            server=server,
            token=pki.admin_token,
            ca_file=pki.ca_cert,
            kubeconfig=kubeconfig,
            pids={p.name: p.pid for p in self.processes + host if p.popen is not None},
            real_nodes=self.real.record() if self.real else {},
        )
        (self.directory / STATE_FILE).write_text(json.dumps(self.info.to_json(), indent=2))

    def _create_nodes(self, api: KubeApi) -> None:
        started = time.monotonic()
        for index in range(self.nodes):
            name = f"kwok-node-{index}"
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {
                    "providerID": f"kwok://{name}",
                    **(
                        {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]}
                        if self.real_nodes
                        else {}
                    ),
                },
                "status": {"allocatable": NODE_CAPACITY, "capacity": NODE_CAPACITY},
            }
            try:
                api.request("POST", "/api/v1/nodes", node)
            except ApiError as exc:
                if exc.status != 409:
                    raise
        kwok = next(p for p in self.processes if p.name == "kwok")
        kwok.wait_ready(lambda: self._nodes_ready(api), START_TIMEOUT_S, f"serving {self.nodes} Ready node(s)")
        manager = next(p for p in self.processes if p.name == "kube-controller-manager")
        manager.wait_ready(
            lambda: api.ok("/api/v1/namespaces/default/serviceaccounts/default"),
            START_TIMEOUT_S,
            "ready (default ServiceAccount created)",
        )
        self.progress(f"  {self.nodes} kwok node(s) Ready ({time.monotonic() - started:.1f}s)")

    def _nodes_ready(self, api: KubeApi) -> bool:
        nodes = api.request("GET", "/api/v1/nodes", timeout=2.0)["items"]
        ready = [
            n
            for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
        ]
        return len(ready) >= self.nodes

    def stop(self) -> None:
        """Remove the real nodes (containers, mounts, networks), then stop every component in reverse order."""
        try:
            if self.real is not None:
                self.real.stop()
                self.real = None
        finally:  # a node that cannot be removed must not leave the control plane running too
            for proc in reversed(self.processes):
                proc.stop()
            self.processes.clear()
        (self.directory / STATE_FILE).unlink(missing_ok=True)


def stop_recorded(directory: Path) -> list[str]:
    """Stop the processes recorded in ``directory/state.json`` (reverse start order); return their names.

    A pid is only signalled while its command line still names the recorded binary's component, so a
    recycled pid of an unrelated process is left alone.
    """
    info = ClusterInfo.load(directory)
    if info is None:
        return []
    stopped = teardown_recorded(info.real_nodes) if info.real_nodes else []
    for name, pid in reversed(list(info.pids.items())):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if Path(cmdline).name == name:
            stop_pid(pid)
            stopped.append(name)
    (directory / STATE_FILE).unlink(missing_ok=True)
    return stopped


def ensure_not_running(directory: Path) -> None:
    """Raise :class:`EnvironmentProblem` when a cluster recorded in ``directory`` is still running."""
    info = ClusterInfo.load(directory)
    if info is not None and any(pid_alive(p) for p in info.pids.values()):
        raise EnvironmentProblem(
            f"a dev cluster is already running from {directory} (API {info.server}); "
            "run `tether dev cluster down` first, or `tether dev cluster env` to use it"
        )
