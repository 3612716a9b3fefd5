"""Build Jaeger from its Go module once per machine, cached beside the Kubernetes binaries (issue 25 item 3).

The trace collector of the tracing test (``tests/e2e/test_tracing.py``): it receives OTLP from the hub, kas and
agentk, keeps the spans in memory and answers queries over its HTTP API. ``go build
github.com/jaegertracing/jaeger/cmd/jaeger`` (Jaeger v2, an OpenTelemetry Collector distribution; module
version v1.76.0, ``../shared/reference/deployment.md`` §1), built by ``go_tool.py`` into
``<cache>/jaeger/v<version>/jaeger``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tether_devenv.build import BuildError, Progress
from tether_devenv.go_tool import GoTool
from tether_devenv.process import ManagedProcess, free_ports

__all__ = ["JAEGER_VERSION", "JaegerServer", "build_jaeger", "jaeger_path"]

#: ``github.com/jaegertracing/jaeger`` module version (``../shared/reference/deployment.md`` §1).
JAEGER_VERSION = "1.76.0"


def _answers_help(binary: Path) -> bool:
    try:
        result = subprocess.run([str(binary), "--help"], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


_JAEGER = GoTool("jaeger", "github.com/jaegertracing/jaeger/cmd/jaeger", JAEGER_VERSION, _answers_help)


def jaeger_path() -> Path:
    """Where the cached Jaeger binary lives: ``<cache>/jaeger/v1.76.0/jaeger`` (it may not exist yet)."""
    return _JAEGER.path


def build_jaeger(force: bool = False, progress: Progress = print) -> Path:
    """Build (or reuse) Jaeger and return its path.

    Raises:
        BuildError: no or too old Go toolchain, or a failed ``go`` step (with the output tail).
    """
    return _JAEGER.build(force, progress)


def _config(otlp_port: int, query_port: int, query_grpc_port: int, health_port: int) -> dict[str, Any]:
    """Jaeger v2 (a Collector) with only what the test needs: OTLP/HTTP in, memory storage, the query API."""
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            # No self-telemetry listener (it would take a fixed port, 8888).
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"127.0.0.1:{health_port}"}},
            "jaeger_query": {
                "storage": {"traces": "memory"},
                "http": {"endpoint": f"127.0.0.1:{query_port}"},
                "grpc": {"endpoint": f"127.0.0.1:{query_grpc_port}"},
            },
            "jaeger_storage": {"backends": {"memory": {"memory": {"max_traces": 10000}}}},
        },
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{otlp_port}"}}}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory"}},
    }


@dataclass
class JaegerServer:
    """A Jaeger all-in-one process on free local ports: OTLP/HTTP receiver and query API, spans in memory.

    Args:
        directory: holds its configuration file and log.
    """

    directory: Path
    otlp_port: int = 0
    query_port: int = 0
    process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def otlp_endpoint(self) -> str:
        """Base URL for OTLP/HTTP exporters (they append ``/v1/traces``)."""
        return f"http://127.0.0.1:{self.otlp_port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the cached binary (build it first with :func:`build_jaeger`) and wait until its query API answers.

        Raises:
            BuildError: Jaeger is not built yet.
            RuntimeError: it exited or did not answer within ``timeout_s``.
        """
        binary = jaeger_path()
        if not _JAEGER.is_built():
            raise BuildError(
                f"jaeger is not built in {binary.parent}: run `make bootstrap` (python -m tether_devenv.jaeger)"
            )
        self.otlp_port, self.query_port, grpc_port, health_port = free_ports(4)
        config = self.directory / "jaeger.yaml"
        config.write_text(yaml.safe_dump(_config(self.otlp_port, self.query_port, grpc_port, health_port)))
        self.process = ManagedProcess("jaeger", [str(binary), "--config", str(config)], self.directory / "jaeger.log")
        self.process.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.get("/api/services")
                return
            except OSError:
                if self.process.popen is not None and self.process.popen.poll() is not None:
                    raise RuntimeError(f"jaeger exited; see {self.process.log_path}") from None
                if time.monotonic() > deadline:
                    why = f"jaeger did not answer within {timeout_s:g} s; see {self.process.log_path}"
                    raise RuntimeError(why) from None
                time.sleep(0.2)

    def get(self, path: str) -> Any:
        """GET ``path`` on the query API and return the decoded JSON (``/api/traces/<id>``: Jaeger's v1 JSON).

        Raises:
            urllib.error.HTTPError: e.g. 404 for a trace not (yet) stored.
            OSError: not listening.
        """
        with urllib.request.urlopen(f"http://127.0.0.1:{self.query_port}{path}", timeout=10) as response:
            return json.load(response)

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """Trace ``trace_id`` (32 hex digits) as Jaeger's v1 JSON (``spans``, ``processes``), or None if unknown."""
        try:
            data = self.get(f"/api/traces/{trace_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        traces = data.get("data") or []
        return traces[0] if traces else None

    def stop(self) -> None:
        """Stop the process."""
        if self.process is not None:
            self.process.stop()


if __name__ == "__main__":
    try:
        build_jaeger(force="--force" in sys.argv[1:])
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
