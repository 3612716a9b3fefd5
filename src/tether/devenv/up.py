"""``tether up``: the whole system on embedded defaults, with readable progress; Ctrl-C stops it all.

Order: local cluster (unless ``KUBECONFIG`` names one) -> hub (SQLite) -> one admin token, a project, an
agent, its token and configuration through the hub's REST API -> kas replicas (memory state, or Redis) ->
with ``--front-proxy``, HAProxy before the agent listener agentk uses (``tether.devenv.front_proxy``) ->
agentk -> a kubeconfig whose server is kas' Kubernetes API proxy and whose token is
``pat:<agent id>:<personal access token>`` (kas.md §4.5).
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

from tether.devenv import pki
from tether.devenv.cluster import LocalCluster, write_kubeconfig
from tether.devenv.commands import console, ensure_binaries
from tether.devenv.front_proxy import FrontProxyParameters, haproxy_binary, start_front_proxy
from tether.devenv.oci import BUSYBOX_IMAGE
from tether.devenv.process import EnvironmentProblem, ManagedProcess, ensure_port_free
from tether.tool.secrets import write_base64_secret

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
    """

    state_dir: Path
    replicas: int = 1
    redis_url: str | None = None
    kubeconfig: Path | None = None
    runtime_tether: str = TETHER
    front_proxy: bool = False


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


def kas_config(options: UpOptions, index: int, secrets_dir: Path, hub_url: str, tls: pki.ClusterPki) -> dict[str, Any]:
    """The kascfg document for replica ``index`` (0-based); ``tls`` serves the Kubernetes API proxy."""
    ports = {name: port + 20 * index for name, port in KAS_PORTS.items()}
    config: dict[str, Any] = {
        "gitlab": {"address": hub_url, "authentication_secret_file": str(secrets_dir / "gitlab_secret")},
        "agent": {
            "listen": {"address": f"127.0.0.1:{ports['agent']}", "listen_grace_period": "0s"},
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


async def bootstrap_agent(hub_url: str, admin_token: str) -> tuple[int, str]:
    """Create (or reuse) the demo project and agent; return (agent id, a fresh agent token)."""
    rest = HubRest(hub_url, admin_token)
    projects = await rest.call("GET", f"/projects?search={PROJECT}")
    project = next((p for p in projects if p["path"] == PROJECT), None)
    if project is None:
        project = await rest.call("POST", "/projects", {"name": PROJECT, "path": PROJECT})
    agents = await rest.call("GET", f"/projects/{project['id']}/cluster_agents")
    agent = next((a for a in agents if a["name"] == AGENT), None)
    if agent is None:
        agent = await rest.call("POST", f"/projects/{project['id']}/cluster_agents", {"name": AGENT})
    config = f"user_access:\n  access_as:\n    agent: {{}}\n  projects:\n    - id: {project['path_with_namespace']}\n"
    await rest.call("PUT", f"/projects/{project['id']}/cluster_agents/{agent['id']}/configuration", text=config)
    token = await rest.call(
        "POST", f"/projects/{project['id']}/cluster_agents/{agent['id']}/tokens", {"name": f"up-{int(time.time())}"}
    )
    return int(agent["id"]), str(token["token"])


def _start(name: str, args: list[str], logs: Path, env: dict[str, str] | None = None) -> ManagedProcess:
    process = ManagedProcess(name, args, logs / f"{name}.log", env=env)
    process.start()
    return process


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
    ports = [HUB_PORT, GITALY_PORT, AGENTK_OBSERVABILITY_PORT] + ([FRONT_PROXY_PORT] if options.front_proxy else [])
    if options.front_proxy:
        haproxy_binary()  # before anything starts: a missing package is a one-line problem
    ports += [p + 20 * i for i in range(options.replicas) for p in KAS_PORTS.values()]
    for port in ports:
        ensure_port_free(port, owner="tether up")

    kubeconfig = options.kubeconfig
    if kubeconfig is None:
        ensure_binaries()
        progress("starting the local Kubernetes cluster")
        running.cluster = LocalCluster(state / "cluster", progress=progress)
        kubeconfig = running.cluster.start().kubeconfig
    progress(f"cluster: {kubeconfig}")

    hub_url = f"http://127.0.0.1:{HUB_PORT}"
    # With several replicas agentk connects to the last one, so requests at kas 1 really travel kas -> kas.
    agent_port = KAS_PORTS["agent"] + 20 * (options.replicas - 1)
    agent_url = f"grpc://127.0.0.1:{FRONT_PROXY_PORT if options.front_proxy else agent_port}"
    hub_env = dict(
        os.environ,
        TETHER_HUB_GITLAB_SECRET_FILE=str(secrets_dir / "gitlab_secret"),
        TETHER_HUB_KAS_API_SECRET_FILE=str(secrets_dir / "gitlab_secret"),
        TETHER_HUB_KAS_API_ADDRESS=f"127.0.0.1:{KAS_PORTS['api']}",
        # Published in GET /api/v4/metadata, where glab finds kas (cluster graph, update-kubeconfig).
        TETHER_HUB_KAS_EXTERNAL_URL=agent_url if options.front_proxy else f"grpc://127.0.0.1:{KAS_PORTS['agent']}",
        # The web console's kubectl snippet and graph relay reach kas' Kubernetes API proxy here.
        TETHER_HUB_KAS_K8S_PROXY_URL=f"https://127.0.0.1:{KAS_PORTS['k8s_proxy']}/k8s-proxy/",
        # The console opens workspaces in kas' path form (no wildcard DNS on a laptop).
        TETHER_HUB_KAS_WORKSPACES_URL=f"http://127.0.0.1:{KAS_PORTS['workspaces']}/",
        # No registry here: the default devfile runs on an image the local node has (the editor is injected).
        TETHER_HUB_WORKSPACES_DEFAULT_IMAGE=BUSYBOX_IMAGE,
        TETHER_HUB_KAS_K8S_PROXY_CA_FILE=str(proxy_tls.ca_cert),
        # On, so that an upstream kas pointed at this hub serves agents their configuration (docs/interop.md).
        TETHER_HUB_GITALY_LISTEN=f"127.0.0.1:{GITALY_PORT}",
    )
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
    agent_id, agent_token = await bootstrap_agent(hub_url, admin_token)
    progress(f"hub ready: project {PROJECT}, agent {AGENT} (id {agent_id})")

    for index in range(options.replicas):
        name = f"kas{index + 1}" if options.replicas > 1 else "kas"
        config_file = state / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(kas_config(options, index, secrets_dir, hub_url, proxy_tls)))
        progress(f"starting {name}")
        kas = _start(name, [options.runtime_tether, "kas", "--configuration-file", str(config_file)], logs)
        running.processes.append(kas)
        await _http_ready(f"http://127.0.0.1:{KAS_PORTS['observability'] + 20 * index}/readiness", kas)

    if options.front_proxy:
        progress("starting the front proxy (HAProxy) before kas' agent listener")
        parameters = FrontProxyParameters(
            listen_address=f"127.0.0.1:{FRONT_PROXY_PORT}", kas_agent_address=f"127.0.0.1:{agent_port}"
        )
        running.processes.append(start_front_proxy(parameters, logs))

    token_file = secrets_dir / "agent_token"
    token_file.write_text(agent_token + "\n")
    token_file.chmod(0o600)
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

    proxy_kubeconfig = state / "kubeconfig"
    proxy_url = f"https://127.0.0.1:{KAS_PORTS['k8s_proxy']}/k8s-proxy/"
    write_kubeconfig(proxy_kubeconfig, proxy_url, f"pat:{agent_id}:{admin_token}", proxy_tls.ca_cert, name="tether")
    return {
        "console": f"{hub_url}/  (sign in as root with the token {admin_token})",
        "kubeconfig (through kas)": f"export KUBECONFIG={shlex.quote(str(proxy_kubeconfig))}",
        "try": "kubectl get nodes",
        "hub": f"{hub_url}/api/v4  (PRIVATE-TOKEN in {admin_file})",
        "kas": f"agent {agent_url}, Kubernetes API proxy {proxy_url}"
        + (f" (front proxy before grpc://127.0.0.1:{agent_port})" if options.front_proxy else ""),
        "workspaces": f"http://127.0.0.1:{KAS_PORTS['workspaces']}/-/workspaces/<workspace name>/<port>/",
        # glab keeps a cluster entry's other fields when it rewrites the server, so this survives re-runs.
        "glab users": (
            "after `glab cluster agent update-kubeconfig --use-context ...`, trust kas' CA once: kubectl config "
            "set-cluster \"$(kubectl config view --minify -o jsonpath='{.clusters[0].name}')\" "
            f"--certificate-authority={shlex.quote(str(proxy_tls.ca_cert))} --embed-certs"
        ),
        "logs": str(logs),
    }


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
def up(replicas: int, redis_url: str | None, state_dir: Path | None, front_proxy: bool) -> None:
    """Run the whole system on embedded defaults; Ctrl-C stops everything.

    Starts the local Kubernetes cluster (unless KUBECONFIG names one; the binaries are built once per
    machine), the hub on SQLite, kas and agentk (with --front-proxy, through HAProxy), registers a demo
    project and agent, then prints a kubeconfig whose server is kas' Kubernetes API proxy.
    """
    kubeconfig = os.environ.get("KUBECONFIG")
    options = UpOptions(
        state_dir=state_dir or Path("~/.local/share/tether/up").expanduser(),
        replicas=replicas,
        redis_url=redis_url,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        front_proxy=front_proxy,
    )

    def show(lines: dict[str, str]) -> None:
        click.echo()
        for label, value in lines.items():
            click.echo(f"{label + ':':28s} {value}")
        click.echo("\nPress Ctrl-C to stop.")

    run_up(options, lambda line: console.print(f"[dim]{line}[/dim]"), show)
