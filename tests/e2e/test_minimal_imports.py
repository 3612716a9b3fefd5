"""A kas and an agentk with a minimal configuration load only what it uses (issue 28 item 4).

Real processes, started and connected, asked through ``tests/support/probe`` which modules they hold: a kas
keeping its state in memory, without the Kubernetes API proxy or workspaces, and an agentk whose agent has no
configuration file. ``tests/unit/test_lazy_imports.py`` checks the imports alone; this checks what start-up and a
connected agent load on top of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_k8s_proxy_upgrade import agent_kubeconfig
from tests.fixtures.hub import RealHub
from tests.fixtures.system import System
from tests.support.loaded_modules import loaded_modules, probe_environment
from tests.support.polling import poll_sync

#: Loaded only by a configuration that uses them (or by other commands): Redis state, the Kubernetes API
#: proxy and its graph WebSocket, the workspaces listener, the graph engine and CEL, the hub, the dev env.
KAS_UNUSED = (
    "redis",
    "tether.tool.redis_backend",
    "tether.modules.kubernetes_api.server.proxy",
    "tether.modules.graph.server.websocket",
    "tether.modules.workspace_access.server.proxy",
    "msgspec",
    "cel_expr_python",
    "tether.hub",
    "fastapi",
    "sqlalchemy",
    "tether_devenv",
    "opentelemetry",  # tracing is off by default: its SDK loads only when an OTLP endpoint is configured
    "websockets",  # parses recorded exec/attach sessions: loads with the first one
)
#: Loaded by the first graph request or by kas only.
AGENTK_UNUSED = (
    "cel_expr_python",
    "tether.modules.graph.engine.engine",
    "redis",
    "pydantic",
    "limits",
    "jwt",
    "tether.kas",
    "tether.modserver",
    "tether.hub",
    "fastapi",
    "sqlalchemy",
    "tether_devenv",
    "opentelemetry",
    "websockets",
)


def test_minimal_kas_and_agentk_load_only_what_they_use(
    system: System, kas_hub: RealHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    for name, value in probe_environment(probe).items():
        monkeypatch.setenv(name, value)  # inherited by the processes started below
    kas_hub.add_agent("minimal-imports-agent", 7601, 76)
    kas = system.kas(use_redis=False, agent={"kubernetes_api": None})
    # agentk needs Kubernetes credentials to start; nothing here calls the cluster (no server listens there).
    kubeconfig = agent_kubeconfig(tmp_path / "agent.kubeconfig", "http://127.0.0.1:9", "unused")
    agentk = system.agentk("minimal-imports-agent", kas, "agentk-minimal-imports", kubeconfig=kubeconfig)

    def ready() -> bool:
        try:
            return agentk.readiness()[0] == 200
        except OSError:  # not listening yet
            return False

    poll_sync(ready, "agentk ready (configuration and a tunnel)", 60)
    assert kas.process is not None

    kas_modules = set(loaded_modules(kas.process.pid, probe))
    agentk_modules = set(loaded_modules(agentk.process.pid, probe))

    assert "tether.modules.agent_configuration.server" in kas_modules  # the probe answered with kas' modules
    assert [name for name in KAS_UNUSED if name in kas_modules] == []
    assert "tether.tunnel.agent.connection" in agentk_modules
    assert [name for name in AGENTK_UNUSED if name in agentk_modules] == []
