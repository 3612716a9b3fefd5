"""``tether up``: the whole system on embedded defaults, with readable progress; Ctrl-C stops it all.

Order: local cluster (unless ``KUBECONFIG`` names one) -> hub (SQLite) -> one admin token, a project, an
agent with workspaces enabled, its token and configuration through the hub's REST API -> kas replicas (memory
state, or Redis) -> with ``--front-proxy``, HAProxy before the agent listener agentk uses
(``tether_devenv.front_proxy``) -> agentk -> a kubeconfig whose server is kas' Kubernetes API proxy and whose
token is ``pat:<agent id>:<personal access token>`` (kas.md §4.5).

By default the cluster has one real node (issue 22 item 5) and agentk runs in it from its chart
(:mod:`tether_devenv.up_agent`), as in a user's cluster; kas and the hub stay processes on the host, kas'
agent listener on the host's address on the node's veth, where pods reach it. With ``--kwok-only`` (or a
``KUBECONFIG``) agentk is a host process as before and the nodes are kwok's.

Every start makes a new cluster, so the workspaces the hub kept from the previous one are marked Terminated
with the reason (:mod:`tether.hub.workspaces.lost`), and the old cluster's volumes are moved aside, not
deleted (issue 23 item 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import click
import yaml
from rich.markup import escape

from tether.tool.secrets import write_base64_secret
from tether_devenv import node_build, pki
from tether_devenv.cluster import LocalCluster, stop_recorded, write_kubeconfig
from tether_devenv.commands import console, ensure_binaries
from tether_devenv.front_proxy import FrontProxyParameters, haproxy_binary, start_front_proxy
from tether_devenv.oci import BUSYBOX_IMAGE, WORKSPACE_IMAGE
from tether_devenv.process import EnvironmentProblem, ManagedProcess, ensure_port_free
from tether_devenv.up_agent import install_agentk

Progress = Callable[[str], None]
TETHER = str(Path(sys.executable).parent / "tether")
HUB_PORT = 8080
#: The hub's Gitaly-compatible service (Gitaly's own default port), where upstream kas reads agent configuration.
GITALY_PORT = 8075
#: kas listeners of replica ``i`` are the upstream defaults plus ``20 * i``.
KAS_PORTS = {
    "agent": 8150,
    "observability": 8151,
    "api": 8153,
    "k8s_proxy": 8154,
    "private_api": 8155,
    "workspaces": 8156,
}
AGENTK_OBSERVABILITY_PORT = 8180
#: Where agentk connects with ``--front-proxy`` (HAProxy, in front of kas' agent listener).
FRONT_PROXY_PORT = 8140
PROJECT = "tether-demo"
AGENT = "local"
#: The demo agent's workspaces DNS zone (``remote_development.dns_zone``, required when enabled): names under
#: ``localhost`` resolve to the loopback in browsers (RFC 6761), so the host form needs no DNS set-up.
WORKSPACES_DNS_ZONE = "workspaces.localhost"


@dataclass
class UpOptions:
    """What ``tether up`` runs.

    Attributes:
        state_dir: where secrets, the hub database, configs and logs live.
        replicas: number of kas processes (2+ requires ``redis_url``).
        redis_url: ``redis://host:port/db`` shared by the kas replicas; None keeps state in memory.
        kubeconfig: cluster for agentk; None starts the local dev cluster.
        runtime_tether: the ``tether`` executable that runs kas and agentk (the footprint benchmark gives
            one installed without extras, as an image would carry).
        front_proxy: put HAProxy (``deploy/front-proxy/haproxy.cfg.template``) in front of the agent listener
            agentk connects to, on :data:`FRONT_PROXY_PORT`; agentk and the hub's published kas address use it.
        kwok_only: the local cluster gets kwok nodes only and agentk runs on the host; False: one real node,
            agentk in it from its chart (ignored with ``kubeconfig``: agentk then runs on the host).
    """

    state_dir: Path
    replicas: int = 1
    redis_url: str | None = None
    kubeconfig: Path | None = None
    runtime_tether: str = TETHER
    front_proxy: bool = False
    kwok_only: bool = False

    @property
    def agentk_in_cluster(self) -> bool:
        """True when agentk runs in the cluster from its chart: the local cluster with its real node."""
        return self.kubeconfig is None and not self.kwok_only


@dataclass
class Running:
    """Everything ``tether up`` started, stopped in reverse order."""

    processes: list[ManagedProcess] = field(default_factory=list)
    cluster: LocalCluster | None = None

    def stop(self) -> None:
        """Stop processes (newest first), then the cluster."""
        for process in reversed(self.processes):
            process.stop()
        if self.cluster is not None:
            self.cluster.stop()


def _redis_address(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[-1].split("/", 1)
    return rest[0], int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else 0


def kas_config(
    options: UpOptions,
    index: int,
    secrets_dir: Path,
    hub_url: str,
    tls: pki.ClusterPki,
    agent_host: str = "127.0.0.1",
) -> dict[str, Any]:
    """The kascfg document for replica ``index`` (0-based); ``tls`` serves the Kubernetes API proxy.

    ``agent_host`` is where the agent listener binds: the loopback for agentk on the host, the host's address
    on the real node's veth for agentk in a pod (every other listener stays on the loopback).
    """
    ports = {name: port + 20 * index for name, port in KAS_PORTS.items()}
    config: dict[str, Any] = {
        "gitlab": {"address": hub_url, "authentication_secret_file": str(secrets_dir / "gitlab_secret")},
        "agent": {
            "listen": {"address": f"{agent_host}:{ports['agent']}", "listen_grace_period": "0s"},
            "configuration": {"poll_period": "10s"},
            "kubernetes_api": {
                # kubectl only sends bearer tokens over TLS.
                "listen": {
                    "address": f"127.0.0.1:{ports['k8s_proxy']}",
                    "certificate_file": str(tls.serving_cert),
                    "key_file": str(tls.serving_key),
                    # Open watches would otherwise hold Ctrl-C for upstream's hour.
                    "listen_grace_period": "0s",
                    "shutdown_grace_period": "3s",
                },
                "url_path_prefix": "/k8s-proxy/",
            },
        },
        "observability": {"listen": {"address": f"127.0.0.1:{ports['observability']}"}},
        "api": {
            "listen": {
                "address": f"127.0.0.1:{ports['api']}",
                "authentication_secret_file": str(secrets_dir / "gitlab_secret"),
            }
        },
        "private_api": {
            "listen": {
                "address": f"127.0.0.1:{ports['private_api']}",
                "authentication_secret_file": str(secrets_dir / "private_api_secret"),
            }
        },
        "routing": {"shutdown_grace_period": "5s"},
        # Workspaces in the path form: a laptop has no wildcard DNS (docs/workspaces.md "Reaching a workspace").
        "workspaces": {
            "listen": {
                "address": f"127.0.0.1:{ports['workspaces']}",
                "listen_grace_period": "0s",
                "shutdown_grace_period": "3s",
            },
            "path_url": f"http://127.0.0.1:{ports['workspaces']}",
        },
    }
    if options.redis_url:
        host_port, db = _redis_address(options.redis_url)
        config["redis"] = {"server": {"address": host_port}, "database_index": db}
    return config


async def _http_ready(url: str, process: ManagedProcess, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as session:
        while True:
            process.check_alive()
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise process.failure(f"did not answer {url} within {limit_s:.0f}s")
            await asyncio.sleep(0.2)


class HubRest:
    """Just enough of the hub's GitLab-shaped REST API to set up the demo project and agent."""

    def __init__(self, base_url: str, token: str) -> None:
        self._base = base_url.rstrip("/") + "/api/v4"
        self._headers = {"PRIVATE-TOKEN": token}

    async def call(self, method: str, path: str, body: Any = None, text: str | None = None) -> Any:
        """One request; returns decoded JSON. Raises EnvironmentProblem with the hub's message on 4xx/5xx."""
        headers = dict(self._headers)
        data: Any = None
        if text is not None:
            headers["Content-Type"] = "application/yaml"
            data = text
        async with (
            aiohttp.ClientSession(headers=headers) as session,
            session.request(method, self._base + path, json=body, data=data) as resp,
        ):
            payload = await resp.text()
            if resp.status >= 300:
                raise EnvironmentProblem(f"hub refused {method} {path}: HTTP {resp.status} {payload[:300]}")
            return yaml.safe_load(payload) if payload else None


def demo_configuration(current: str, project_path: str) -> str | None:
    """The demo agent's configuration given its ``current`` text; None when it needs no change.

    A first start writes ``user_access`` (``access_as: agent`` for the demo project) and ``remote_development``
    (workspaces on, :data:`WORKSPACES_DNS_ZONE`). Later starts keep what the file says, the user's edits
    included, and only append a section that is missing, as text (the user's comments stay). A file that is
    not a YAML mapping is left alone (the hub validated it when it was stored).
    """
    sections: dict[str, Any] = {
        "user_access": {"access_as": {"agent": {}}, "projects": [{"id": project_path}]},
        "remote_development": {"enabled": True, "dns_zone": WORKSPACES_DNS_ZONE},
    }
    try:
        document = yaml.safe_load(current) if current.strip() else {}
    except yaml.YAMLError:
        return None
    if not isinstance(document, dict):
        return None
    missing = {key: value for key, value in sections.items() if key not in document}
    if not missing:
        return None
    appended = (current.rstrip("\n") + "\n" if current.strip() else "") + yaml.safe_dump(missing, sort_keys=False)
    try:
        if yaml.safe_load(appended) == {**document, **missing}:
            return appended
    except yaml.YAMLError:
        pass
    return yaml.safe_dump({**document, **missing}, sort_keys=False)  # a flow-style mapping cannot take text


async def bootstrap_agent(hub_url: str, admin_token: str) -> tuple[int, int, str]:
    """Create (or reuse) the demo project and agent; return (project id, agent id, a fresh agent token).

    The agent's configuration is completed by :func:`demo_configuration`, never replaced.
    """
    rest = HubRest(hub_url, admin_token)
    projects = await rest.call("GET", f"/projects?search={PROJECT}")
    project = next((p for p in projects if p["path"] == PROJECT), None)
    if project is None:
        project = await rest.call("POST", "/projects", {"name": PROJECT, "path": PROJECT})
    agents = await rest.call("GET", f"/projects/{project['id']}/cluster_agents")
    agent = next((a for a in agents if a["name"] == AGENT), None)
    if agent is None:
        agent = await rest.call("POST", f"/projects/{project['id']}/cluster_agents", {"name": AGENT})
    config_path = f"/projects/{project['id']}/cluster_agents/{agent['id']}/configuration"
    current = await rest.call("GET", config_path)
    config = demo_configuration(str(current.get("content") or ""), project["path_with_namespace"])
    if config is not None:
        await rest.call("PUT", config_path, text=config)
    token = await rest.call(
        "POST", f"/projects/{project['id']}/cluster_agents/{agent['id']}/tokens", {"name": f"up-{int(time.time())}"}
    )
    return int(project["id"]), int(agent["id"]), str(token["token"])


def _start(name: str, args: list[str], logs: Path, env: dict[str, str] | None = None) -> ManagedProcess:
    process = ManagedProcess(name, args, logs / f"{name}.log", env=env)
    process.start()
    return process


def _set_aside_volumes(cluster_dir: Path, state: Path, progress: Progress) -> Path | None:
    """Stop what a previous run left, then move its volumes out of the cluster directory the new cluster wipes.

    Returns where the volumes went (``<state>/previous-volumes/<UTC time>``), None when there were none.
    """
    left = stop_recorded(cluster_dir)  # a run killed without its clean-up left the real node's processes
    if left:
        progress(f"stopped what a previous run left: {', '.join(left)}")
    volumes = cluster_dir / "local-path"
    if not volumes.is_dir() or not any(volumes.iterdir()):
        return None
    target = state / "previous-volumes" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target.parent.mkdir(parents=True, exist_ok=True)
    volumes.rename(target)
    progress(f"the previous cluster's volumes (workspaces' data) are kept in {target}")
    return target


async def _start_cluster(options: UpOptions, progress: Progress, running: Running) -> Path | None:
    """Start the local cluster (real node unless ``kwok_only``); return where old volumes went (or None)."""
    ensure_binaries()
    real = options.agentk_in_cluster
    if real:
        if os.geteuid() != 0:
            raise EnvironmentProblem(
                "the real node needs root (network namespaces, containerd, kubelet): run `make up` as root, "
                "or `tether up --kwok-only` for a cluster of kwok nodes (no containers run)"
            )
        if node_build.cache_problem() is not None:
            progress("the real node's binaries are not built yet; building them once for this machine")
            node_build.build(progress=progress)
    cluster_dir = options.state_dir / "cluster"
    kept = _set_aside_volumes(cluster_dir, options.state_dir, progress)
    progress("starting the local Kubernetes cluster" + (" with a real node" if real else " (kwok nodes only)"))
    running.cluster = LocalCluster(cluster_dir, nodes=0 if real else 1, real_nodes=1 if real else 0, progress=progress)
    # In the event loop's thread on purpose: Ctrl-C is handled once start returns, so the clean-up never
    # races a half-made node (its namespace, mounts and rules are recorded as they are made).
    running.cluster.start()
    return kept


async def _mark_workspaces_lost(
    hub_base: list[str], hub_env: dict[str, str], project: str, kept: Path | None, progress: Progress
) -> None:
    """Tell the hub the demo agent's workspaces went with the old cluster (``tether hub agent workspaces-lost``)."""
    reason = "lost: `tether up` replaced the development cluster this workspace ran in" + (
        f"; its volume's data is kept in {kept}" if kept else ""
    )
    command = await asyncio.create_subprocess_exec(
        *hub_base,
        "agent",
        "workspaces-lost",
        project,
        AGENT,
        "--reason",
        reason,
        env=hub_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await command.communicate()
    if command.returncode != 0:
        raise EnvironmentProblem(f"tether hub agent workspaces-lost failed: {err.decode().strip()[-500:]}")
    names = out.decode().split()
    if names:
        progress(f"workspaces of the previous cluster marked Terminated (lost): {', '.join(names)}")


async def bring_up(options: UpOptions, progress: Progress, running: Running) -> dict[str, str]:
    """Start everything; return the lines to print (name -> value). Raises EnvironmentProblem."""
    state = options.state_dir
    logs, secrets_dir = state / "logs", state / "secrets"
    for directory in (logs, secrets_dir):
        directory.mkdir(parents=True, exist_ok=True)
    for name in ("gitlab_secret", "private_api_secret"):
        if not (secrets_dir / name).exists():
            write_base64_secret(secrets_dir / name, secrets.token_bytes(32))
    proxy_tls = pki.generate(state / "proxy-tls")
    if options.replicas > 1 and not options.redis_url:
        raise EnvironmentProblem("--replicas above 1 needs --redis: kas replicas share their state through Redis")
    ports = [HUB_PORT, GITALY_PORT] + ([FRONT_PROXY_PORT] if options.front_proxy else [])
    ports += [] if options.agentk_in_cluster else [AGENTK_OBSERVABILITY_PORT]
    if options.front_proxy:
        haproxy_binary()  # before anything starts: a missing package is a one-line problem
    ports += [p + 20 * i for i in range(options.replicas) for p in KAS_PORTS.values()]
    for port in ports:
        ensure_port_free(port, owner="tether up")

    kubeconfig = options.kubeconfig
    kept: Path | None = None
    new_cluster = kubeconfig is None
    agent_host = "127.0.0.1"
    if kubeconfig is None:
        kept = await _start_cluster(options, progress, running)
        assert running.cluster is not None and running.cluster.info is not None
        kubeconfig = running.cluster.info.kubeconfig
        if running.cluster.real is not None:
            agent_host = running.cluster.real.api_address  # the host's end of the node's veth
    progress(f"cluster: {kubeconfig}")

    hub_url = f"http://127.0.0.1:{HUB_PORT}"
    # With several replicas agentk connects to the last one, so requests at kas 1 really travel kas -> kas.
    agent_port = KAS_PORTS["agent"] + 20 * (options.replicas - 1)
    agent_url = f"grpc://{agent_host}:{FRONT_PROXY_PORT if options.front_proxy else agent_port}"
    hub_env = dict(
        os.environ,
        TETHER_HUB_GITLAB_SECRET_FILE=str(secrets_dir / "gitlab_secret"),
        TETHER_HUB_KAS_API_SECRET_FILE=str(secrets_dir / "gitlab_secret"),
        TETHER_HUB_KAS_API_ADDRESS=f"127.0.0.1:{KAS_PORTS['api']}",
        # Published in GET /api/v4/metadata, where glab finds kas (cluster graph, update-kubeconfig).
        TETHER_HUB_KAS_EXTERNAL_URL=agent_url if options.front_proxy else f"grpc://{agent_host}:{KAS_PORTS['agent']}",
        # The web console's kubectl snippet and graph relay reach kas' Kubernetes API proxy here.
        TETHER_HUB_KAS_K8S_PROXY_URL=f"https://127.0.0.1:{KAS_PORTS['k8s_proxy']}/k8s-proxy/",
        # The console opens workspaces in kas' path form (no wildcard DNS on a laptop).
        TETHER_HUB_KAS_WORKSPACES_URL=f"http://127.0.0.1:{KAS_PORTS['workspaces']}/",
        TETHER_HUB_KAS_K8S_PROXY_CA_FILE=str(proxy_tls.ca_cert),
        # On, so that an upstream kas pointed at this hub serves agents their configuration (docs/interop.md).
        TETHER_HUB_GITALY_LISTEN=f"127.0.0.1:{GITALY_PORT}",
    )
    if options.agentk_in_cluster:
        # The node reaches no registry: the default devfile runs the node's local workspace image instead.
        hub_env["TETHER_HUB_WORKSPACES_DEFAULT_DEVFILE_IMAGE"] = WORKSPACE_IMAGE
    hub_base = [TETHER, "hub", "--data-dir", str(state / "hub")]
    progress("starting the hub (SQLite)")
    hub = _start("hub", [*hub_base, "serve", "--listen", f"127.0.0.1:{HUB_PORT}"], logs, hub_env)
    running.processes.append(hub)
    await _http_ready(f"{hub_url}/openapi.json", hub)
    bootstrap = await asyncio.create_subprocess_exec(
        *hub_base, "bootstrap", env=hub_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await bootstrap.communicate()
    if bootstrap.returncode != 0:
        raise EnvironmentProblem(f"tether hub bootstrap failed: {err.decode().strip()[-500:]}")
    admin_token = out.decode().strip()
    admin_file = secrets_dir / "admin_token"
    admin_file.write_text(admin_token + "\n")
    admin_file.chmod(0o600)
    project_id, agent_id, agent_token = await bootstrap_agent(hub_url, admin_token)
    if new_cluster:  # before agentk's first full reconciliation could recreate them empty
        await _mark_workspaces_lost(hub_base, hub_env, str(project_id), kept, progress)
    progress(f"hub ready: project {PROJECT}, agent {AGENT} (id {agent_id}), workspaces enabled")

    for index in range(options.replicas):
        name = f"kas{index + 1}" if options.replicas > 1 else "kas"
        config_file = state / f"{name}.yaml"
        config = kas_config(options, index, secrets_dir, hub_url, proxy_tls, agent_host)
        config_file.write_text(yaml.safe_dump(config))
        progress(f"starting {name}")
        kas = _start(name, [options.runtime_tether, "kas", "--configuration-file", str(config_file)], logs)
        running.processes.append(kas)
        await _http_ready(f"http://127.0.0.1:{KAS_PORTS['observability'] + 20 * index}/readiness", kas)

    if options.front_proxy:
        progress("starting the front proxy (HAProxy) before kas' agent listener")
        parameters = FrontProxyParameters(
            listen_address=f"{agent_host}:{FRONT_PROXY_PORT}", kas_agent_address=f"{agent_host}:{agent_port}"
        )
        running.processes.append(start_front_proxy(parameters, logs))

    token_file = secrets_dir / "agent_token"
    token_file.write_text(agent_token + "\n")
    token_file.chmod(0o600)
    if options.agentk_in_cluster:
        assert running.cluster is not None
        pods = await install_agentk(running.cluster, agent_url, agent_token, state, progress)
        agentk_line = f"{', '.join(pods)} in namespace tether-system (chart deploy/helm/tether-agent)"
    else:
        progress("starting agentk")
        agentk = _start(
            "agentk",
            [
                options.runtime_tether,
                "agentk",
                "--kas-address",
                agent_url,
                "--token-file",
                str(token_file),
                "--kubeconfig",
                str(kubeconfig),
                "--observability-listen-address",
                f"127.0.0.1:{AGENTK_OBSERVABILITY_PORT}",
            ],
            logs,
            dict(os.environ, POD_NAME="agentk-local", POD_NAMESPACE="tether-system"),
        )
        running.processes.append(agentk)
        await _http_ready(f"http://127.0.0.1:{AGENTK_OBSERVABILITY_PORT}/readiness", agentk)
        agentk_line = f"a process on the host, log {logs / 'agentk.log'}"

    proxy_kubeconfig = state / "kubeconfig"
    proxy_url = f"https://127.0.0.1:{KAS_PORTS['k8s_proxy']}/k8s-proxy/"
    write_kubeconfig(proxy_kubeconfig, proxy_url, f"pat:{agent_id}:{admin_token}", proxy_tls.ca_cert, name="tether")
    lines = {
        "console": f"{hub_url}/  (sign in as root with the token {admin_token})",
        "kubeconfig (through kas)": f"export KUBECONFIG={shlex.quote(str(proxy_kubeconfig))}",
        "try": "kubectl get nodes",
    }
    if options.agentk_in_cluster:
        lines["run a container"] = (
            f"kubectl run demo --image={BUSYBOX_IMAGE} --restart=Never -- sleep 3600 && "
            "kubectl wait --for=condition=Ready pod/demo && kubectl exec -it demo -- sh"
        )
    lines |= {
        "hub": f"{hub_url}/api/v4  (PRIVATE-TOKEN in {admin_file})",
        "kas": f"agent {agent_url}, Kubernetes API proxy {proxy_url}"
        + (f" (front proxy before grpc://{agent_host}:{agent_port})" if options.front_proxy else ""),
        "agentk": agentk_line,
        "workspace": (
            f"TETHER_HUB_URL={hub_url} TETHER_PAT=$(cat {shlex.quote(str(admin_file))}) "
            f"tether workspace create --agent {agent_id} --project {project_id} --wait"
        ),
        "workspaces": workspaces_url_line(),
        # glab keeps a cluster entry's other fields when it rewrites the server, so this survives re-runs.
        "glab users": (
            "after `glab cluster agent update-kubeconfig --use-context ...`, trust kas' CA once: kubectl config "
            "set-cluster \"$(kubectl config view --minify -o jsonpath='{.clusters[0].name}')\" "
            f"--certificate-authority={shlex.quote(str(proxy_tls.ca_cert))} --embed-certs"
        ),
        "logs": str(logs),
    }
    return lines


def workspaces_url_line() -> str:
    """Where ``tether up`` says workspaces are opened (kas' workspaces listener, path form)."""
    return f"http://127.0.0.1:{KAS_PORTS['workspaces']}/-/workspaces/<workspace name>/<port>/"


def run_up(options: UpOptions, progress: Progress, show: Callable[[dict[str, str]], None]) -> None:
    """Bring everything up, show how to reach it, wait for Ctrl-C/SIGTERM, then stop it all."""
    running = Running()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_up_until_stopped(options, progress, show, running))
    finally:
        progress("stopping")
        running.stop()
        loop.close()


async def _up_until_stopped(
    options: UpOptions, progress: Progress, show: Callable[[dict[str, str]], None], running: Running
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bring = asyncio.ensure_future(bring_up(options, progress, running))
    interrupted = asyncio.ensure_future(stop.wait())
    await asyncio.wait({bring, interrupted}, return_when=asyncio.FIRST_COMPLETED)
    interrupted.cancel()
    if not bring.done():
        bring.cancel()
        await asyncio.gather(bring, interrupted, return_exceptions=True)
        return
    show(bring.result())
    await _watch(running, stop)


async def _watch(running: Running, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for process in running.processes:
            process.check_alive()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


@click.command("up")
@click.option("--replicas", default=1, show_default=True, help="Number of kas replicas (2+ needs --redis).")
@click.option(
    "--redis", "redis_url", default=None, help="Redis URL shared by the kas replicas, e.g. redis://127.0.0.1:6379/0."
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the hub database, secrets, configs and logs live (default: ~/.local/share/tether/up).",
)
@click.option(
    "--front-proxy",
    is_flag=True,
    help="Put HAProxy (Debian's haproxy; deploy/front-proxy/) in front of kas' agent listener; agentk connects "
    f"through it on port {FRONT_PROXY_PORT}.",
)
@click.option(
    "--kwok-only",
    is_flag=True,
    help="A cluster of kwok nodes only (no containers run; no root needed), with agentk as a host process, "
    "instead of the default real node with agentk in it from its chart.",
)
def up(replicas: int, redis_url: str | None, state_dir: Path | None, front_proxy: bool, kwok_only: bool) -> None:
    """Run the whole system on embedded defaults; Ctrl-C stops everything.

    Starts the local Kubernetes cluster with one real node (containerd, kubelet; needs root; the binaries
    and images are built once per machine and reused), the hub on SQLite and kas as host processes, then
    agentk in the cluster from its chart (deploy/helm/tether-agent) with a token from the hub. Registers a
    demo project and agent with workspaces enabled, then prints a kubeconfig whose server is kas' Kubernetes
    API proxy and a command that runs a container and execs into it through kas.

    Every start makes a new cluster: workspaces the hub kept from the previous one are marked Terminated
    (lost) and their volumes moved to <state-dir>/previous-volumes. With KUBECONFIG set, that cluster is
    used as it is and agentk runs on the host; so it does with --kwok-only.
    """
    kubeconfig = os.environ.get("KUBECONFIG")
    options = UpOptions(
        state_dir=state_dir or Path("~/.local/share/tether/up").expanduser(),
        replicas=replicas,
        redis_url=redis_url,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        front_proxy=front_proxy,
        kwok_only=kwok_only,
    )

    def show(lines: dict[str, str]) -> None:
        click.echo()
        for label, value in lines.items():
            click.echo(f"{label + ':':28s} {value}")
        click.echo("\nPress Ctrl-C to stop.")

    # soft_wrap: a long line (a path) stays one line in a log, as scripts and tests read it.
    run_up(options, lambda line: console.print(f"[dim]{escape(line)}[/dim]", soft_wrap=True), show)
