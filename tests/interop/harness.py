"""Upstream GitLab programs (kas, agentk, glab) run as real processes next to Tether's, for the interop tests.

The binaries are built once per machine from ``../shared/upstream`` (``tether dev upstream build``) and
cached under ``~/.cache/tether/upstream``. Everything here talks to the real hub, real Redis and the real
cluster; nothing is stubbed.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.k8s import Kubectl
from tests.fixtures.system import K8S_PROXY_PREFIX, KasProc, System, http_get
from tests.hub.helpers import kas_config
from tether_devenv import pki
from tether_devenv.process import ManagedProcess, free_port, free_ports
from tether_devenv.redis_server import RedisServer
from tether_devenv.upstream import UpstreamBinaries

PROJECT = "platform/clusters"
AGENT = "interop"


def answers_200(url: str) -> bool:
    """True when ``url`` answers 200; False while nothing listens yet or it answers otherwise."""
    try:
        return http_get(url)[0] == 200
    except OSError:
        return False


def error_lines(log: Path) -> list[str]:
    """Lines of a JSON log (zap or structlog) at level error or worse, plus Go panics."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("panic:"):
            found.append(line)
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and str(entry.get("level", "")).lower() in ("error", "fatal", "panic", "critical"):
            found.append(line)
    return found


@dataclass
class UpstreamKas:
    """A running upstream kas: its ports, config and log."""

    process: ManagedProcess
    ports: dict[str, int]
    directory: Path
    ca: Path

    @property
    def agent_address(self) -> str:
        return f"grpc://127.0.0.1:{self.ports['agent']}"

    @property
    def k8s_proxy_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['k8s_proxy']}{K8S_PROXY_PREFIX}"

    def ready(self) -> bool:
        return answers_200(f"http://127.0.0.1:{self.ports['observability']}/readiness")


@dataclass
class UpstreamAgentk:
    """A running upstream agentk."""

    name: str
    process: ManagedProcess
    observability_port: int

    def ready(self) -> bool:
        return answers_200(f"http://127.0.0.1:{self.observability_port}/readiness")


@dataclass
class Interop:
    """The real hub (with its Gitaly-compatible service), an agent with a token and a user with a k8s_proxy PAT,
    and starters for upstream and Tether kas/agentk.

    Attributes:
        hub: the running hub; ``hub.config.gitaly`` serves configuration files to upstream kas.
        agent_id, project_id: the agent ``platform/clusters`` / ``interop``.
        agent_token: its token.
        user_token: a ``k8s_proxy`` token of ``dev``, Developer of the project.
    """

    directory: Path
    bins: UpstreamBinaries
    launcher: HubLauncher
    hub: RealHub
    system: System
    redis: RedisServer
    tls: pki.ClusterPki
    cluster_kubeconfig: Path
    kubectl_binary: Path
    agent_id: int = 0
    project_id: int = 0
    agent_token: str = ""
    user_token: str = ""
    processes: list[ManagedProcess] = field(default_factory=list)

    def set_configuration(self, yaml_text: str) -> None:
        """Store the agent's configuration file in the hub."""
        from tests.hub.helpers import Setup  # noqa: PLC0415

        kas_config(self.hub, Setup(self.project_id, self.agent_id, {}, {}), yaml_text)

    def upstream_kas(self) -> UpstreamKas:
        """Start upstream kas against the hub and Redis; waits for readiness."""
        directory = self.directory / f"upstream-kas-{len(self.processes)}"
        directory.mkdir()
        names = ("agent", "api", "private_api", "observability", "k8s_proxy")
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        private_secret = directory / "private_secret"
        private_secret.write_text(self.system.private_secret_file.read_text())
        config: dict[str, Any] = {
            "gitlab": {"address": self.hub.url, "authentication_secret_file": str(self.hub.secret_file)},
            "agent": {
                "listen": {"address": f"127.0.0.1:{ports['agent']}"},
                "configuration": {"poll_period": "2s"},
                "info_cache_ttl": "1s",
                "info_cache_error_ttl": "1s",
                "kubernetes_api": {
                    "listen": {
                        "address": f"127.0.0.1:{ports['k8s_proxy']}",
                        "certificate_file": str(self.tls.serving_cert),
                        "key_file": str(self.tls.serving_key),
                    },
                    "url_path_prefix": K8S_PROXY_PREFIX,
                },
            },
            "observability": {"listen": {"address": f"127.0.0.1:{ports['observability']}"}},
            "api": {
                "listen": {
                    "address": f"127.0.0.1:{ports['api']}",
                    "authentication_secret_file": str(self.hub.secret_file),
                }
            },
            "private_api": {
                "listen": {
                    "address": f"127.0.0.1:{ports['private_api']}",
                    "authentication_secret_file": str(private_secret),
                }
            },
            "redis": {"server": {"address": f"127.0.0.1:{self.redis.port}"}, "key_prefix": f"up{ports['agent']}"},
        }
        path = directory / "kas.yaml"
        path.write_text(yaml.safe_dump(config))
        process = ManagedProcess(
            "upstream-kas", [str(self.bins.kas), "--configuration-file", str(path)], directory / "kas.log"
        )
        self.processes.append(process)
        process.start()
        kas = UpstreamKas(process, ports, directory, self.tls.ca_cert)
        process.wait_ready(kas.ready, 60, "ready", ports["observability"])
        return kas

    def upstream_agentk(self, kas_address: str, name: str = "upstream-agentk") -> UpstreamAgentk:
        """Start upstream agentk with the agent's token and the cluster's admin kubeconfig.

        Its leader election keeps a Lease in ``POD_NAMESPACE`` (``gitlab-agent``), created here when missing.
        """
        kubectl = Kubectl(self.kubectl_binary, self.cluster_kubeconfig)
        if kubectl.run("get", "namespace", "gitlab-agent", check=False).returncode != 0:
            kubectl.run("create", "namespace", "gitlab-agent", check=False)
        token_file = self.directory / f"{name}.token"
        token_file.write_text(self.agent_token)
        port = free_port()
        args = [str(self.bins.agentk), "--kas-address", kas_address, "--token-file", str(token_file)]
        args += ["--kubeconfig", str(self.cluster_kubeconfig), "--observability-listen-address", f"127.0.0.1:{port}"]
        env = dict(os.environ, POD_NAMESPACE="gitlab-agent", POD_NAME=name)
        process = ManagedProcess(name, args, self.directory / f"{name}.log", env=env)
        self.processes.append(process)
        process.start()
        return UpstreamAgentk(name, process, port)

    def tether_kas(self) -> KasProc:
        """Start Tether kas against the hub and Redis."""
        return self.system.kas()

    def proxy_kubectl(self, server: str, name: str, namespace: str = "default") -> Kubectl:
        """kubectl whose server is a kas Kubernetes API proxy (TLS) with ``pat:<agent id>:<user token>``."""
        path = self.directory / f"{name}.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "kas", "cluster": {"server": server, "certificate-authority": str(self.tls.ca_cert)}}
                    ],
                    "users": [{"name": "dev", "user": {"token": f"pat:{self.agent_id}:{self.user_token}"}}],
                    "contexts": [{"name": "kas", "context": {"cluster": "kas", "user": "dev", "namespace": namespace}}],
                    "current-context": "kas",
                }
            )
        )
        return Kubectl(self.kubectl_binary, path)

    def glab(self, *args: str, token: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run upstream glab against the hub with ``token`` (default: the admin's ``api`` token)."""
        config_dir = self.directory / "glab-config"
        config_dir.mkdir(exist_ok=True)
        host = self.hub.url.removeprefix("http://")
        # The hub serves plain HTTP: glab needs api_protocol per host (its default is https).
        config = {"check_update": False, "hosts": {host: {"api_protocol": "http", "api_host": host}}}
        (config_dir / "config.yml").write_text(yaml.safe_dump(config))
        (config_dir / "config.yml").chmod(0o600)
        env = dict(
            os.environ,
            GITLAB_HOST=self.hub.url,
            GITLAB_TOKEN=token or self.hub.admin_token,
            GLAB_CONFIG_DIR=str(config_dir),
            GLAB_CHECK_UPDATE="false",
            GLAB_SEND_TELEMETRY="false",
            NO_COLOR="1",
            HOME=str(self.directory),
        )
        return subprocess.run(
            [str(self.bins.glab), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.system.stop_all()
