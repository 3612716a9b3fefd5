"""``tether dev ...``: build, start, stop and locate the local Kubernetes cluster."""

from __future__ import annotations

import os
import shlex
import signal
import threading
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from tether_devenv import node_build, upstream
from tether_devenv.assets import AssetsMissing, cache_problem, cache_root
from tether_devenv.build import BuildError, build
from tether_devenv.cluster import ClusterInfo, LocalCluster, ensure_not_running, stop_recorded
from tether_devenv.node import STORAGE_CLASS
from tether_devenv.oci import BUSYBOX_IMAGE
from tether_devenv.process import EnvironmentProblem

console = Console(stderr=True, highlight=False)


def report_setup_problem(exc: BaseException) -> bool:
    """Print a set-up problem (no Go, port in use, stale cache...) as one paragraph; False for other errors."""
    if not isinstance(exc, (EnvironmentProblem, AssetsMissing, BuildError)):
        return False
    console.print(f"[bold red]error:[/bold red] {exc}", markup=True)
    return True


def default_cluster_dir() -> Path:
    """Where ``tether dev cluster`` keeps its cluster: ``<cache>/dev-cluster``."""
    return cache_root() / "dev-cluster"


def _progress(message: str) -> None:
    # Build steps are labelled "[etcd]", "[gitlab-agent]": literal text, not rich markup.
    console.print(f"[dim]{escape(message)}[/dim]")


def ensure_binaries() -> None:
    """Build the cluster binaries when they are not cached yet (no-op otherwise); shows progress."""
    if cache_problem() is not None:
        console.print("[bold]Kubernetes binaries are not built yet; building them once for this machine.[/bold]")
        console.print("[dim]This takes roughly 10-30 minutes on 2 cores; later starts take seconds.[/dim]")
        build(progress=_progress)


def print_access(info: ClusterInfo) -> None:
    """Print how to reach the cluster, with copy-pasteable commands, on standard output."""
    click.echo(f"Kubernetes API: {info.server}")
    click.echo(f"kubeconfig:     {info.kubeconfig}")
    click.echo(f"  export KUBECONFIG={shlex.quote(str(info.kubeconfig))}")
    click.echo("  kubectl get nodes")
    for node in info.real_nodes.get("nodes", []):
        net = node["net"]
        click.echo(f"real node:      {net['name']} at {net['node_address']}, pods {net['pod_cidr']}")
    if info.real_nodes:
        click.echo(f"  kubectl run demo --image={BUSYBOX_IMAGE} -- sleep 3600")
        click.echo("  kubectl wait --for=condition=Ready pod/demo && kubectl exec demo -- ls /")
        click.echo(f"  default StorageClass: {STORAGE_CLASS}; cluster DNS: kube-system/kube-dns")
    click.echo(f"logs:           {info.directory / 'logs'}")


def start_cluster(directory: Path, nodes: int, api_port: int | None, real_nodes: int = 0) -> LocalCluster:
    """Build binaries if needed, refuse a second cluster in ``directory``, and start one.

    ``real_nodes`` > 0 adds nodes that run containers (:mod:`tether_devenv.node`); their binaries are built
    first when missing.

    Raises:
        tether_devenv.process.EnvironmentProblem: and subclasses, with a message for a person.
    """
    ensure_binaries()
    if real_nodes and node_build.cache_problem() is not None:
        console.print("[bold]The real node's binaries are not built yet; building them once for this machine.[/bold]")
        node_build.build(progress=_progress)
    ensure_not_running(directory)
    console.print(f"[bold]Starting the local Kubernetes cluster[/bold] in {directory}")
    cluster = LocalCluster(directory, nodes=nodes, api_port=api_port, progress=_progress, real_nodes=real_nodes)
    cluster.start()
    return cluster


def wait_for_exit(cluster: LocalCluster) -> None:
    """Block until SIGINT/SIGTERM or until a component dies (its log tail is shown), then stop all."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            for proc in cluster.all_processes():
                proc.check_alive()
    finally:
        console.print("[bold]Stopping the cluster[/bold]")
        cluster.stop()


@click.group()
def dev() -> None:
    """Development environment: a real local Kubernetes cluster built from upstream sources."""


@dev.group()
def cluster() -> None:
    """Build, start, stop and locate the local cluster (etcd, kube-apiserver, controller manager, scheduler, kwok)."""


@cluster.command("build")
@click.option("--force", is_flag=True, help="Rebuild even when the cache is complete.")
def build_command(force: bool) -> None:
    """Build the cluster binaries once per machine from the Go module proxy (needs Go >= 1.24).

    The control plane (etcd, kube-apiserver, controller manager, scheduler, kwok, kubectl) first, then the
    real node's kubelet, kube-proxy, CoreDNS and local-path-provisioner, one after the other. Binaries are
    cached outside the repository (``$TETHER_CACHE_DIR`` or ``~/.cache/tether``). Set KUBEBUILDER_ASSETS or
    TEST_ASSET_<NAME> to use existing control-plane binaries instead.
    """
    build(force=force, progress=_progress)
    node_build.build(force=force, progress=_progress)


@dev.group("upstream")
def upstream_group() -> None:
    """Upstream GitLab kas, agentk and glab built from ../shared/upstream, the interop test peers."""


@upstream_group.command("build")
@click.option("--force", is_flag=True, help="Rebuild even when the cache is complete.")
def upstream_build_command(force: bool) -> None:
    """Build upstream kas, agentk and glab once per machine (needs Go >= 1.24 and the Go module proxy).

    Sources come from ``../shared/upstream`` beside the repository (or ``$TETHER_UPSTREAM_SOURCES``);
    binaries are cached under ``~/.cache/tether/upstream/`` (``$TETHER_CACHE_DIR`` moves it).
    """
    upstream.build(force=force, progress=_progress)


@upstream_group.command("path")
def upstream_path_command() -> None:
    """Print the directory holding the built upstream binaries, or fail when they are not built."""
    binaries = upstream.locate()
    click.echo(binaries.kas.parent)


@cluster.command("up")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None, help="State directory.")
@click.option("--nodes", default=1, show_default=True, help="Number of kwok fake nodes (may be 0 with real nodes).")
@click.option(
    "--real-nodes",
    type=click.IntRange(0, 8),
    default=0,
    show_default=True,
    help="Number of real nodes that run containers (containerd, kubelet, kube-proxy; needs root). With real "
    "nodes the cluster also gets DNS (CoreDNS) and a default StorageClass (local-path), and kwok nodes are "
    "tainted so that pods land on real nodes unless they tolerate kwok.x-k8s.io/node=fake.",
)
@click.option("--api-port", type=int, default=None, help="Fixed API server port (default: a free one).")
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C stops the cluster.")
def up_command(directory: Path | None, nodes: int, real_nodes: int, api_port: int | None, foreground: bool) -> None:
    """Start the local cluster (building the binaries first if needed) and print how to reach it."""
    directory = directory or default_cluster_dir()
    if real_nodes and os.geteuid() != 0:
        raise click.UsageError("--real-nodes needs root (network namespaces, containerd, kubelet)")
    local = start_cluster(directory, nodes, api_port, real_nodes)
    assert local.info is not None
    print_access(local.info)
    if foreground:
        wait_for_exit(local)
    else:
        click.echo("Stop it with: tether dev cluster down")


@cluster.command("down")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None, help="State directory.")
def down_command(directory: Path | None) -> None:
    """Stop the cluster started by ``tether dev cluster up`` (by recorded pid)."""
    stopped = stop_recorded(directory or default_cluster_dir())
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "no running dev cluster")


@cluster.command("env")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None, help="State directory.")
def env_command(directory: Path | None) -> None:
    """Print shell exports for the running cluster: eval "$(tether dev cluster env)"."""
    info = ClusterInfo.load(directory or default_cluster_dir())
    if info is None or not info.running():
        raise click.ClickException("no running dev cluster; start one with `tether dev cluster up`")
    click.echo(f"export KUBECONFIG={shlex.quote(str(info.kubeconfig))}")


@cluster.command("status")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None, help="State directory.")
def status_command(directory: Path | None) -> None:
    """Show whether the cluster runs, its API URL and memory use, and the binary cache state."""
    problem = cache_problem()
    click.echo(f"binaries: {'cached' if problem is None else problem}")
    info = ClusterInfo.load(directory or default_cluster_dir())
    if info is None or not info.running():
        click.echo("cluster: not running")
        return
    click.echo(f"cluster: running at {info.server}, {info.rss_mib():.0f} MiB RSS")
    print_access(info)
