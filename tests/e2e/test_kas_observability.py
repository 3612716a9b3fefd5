"""kas' observability listener on a real process: readiness follows Redis, metrics are Prometheus text."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.fixtures.system import TETHER, System, http_get
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer


def test_readiness_is_false_until_redis_is_reachable(system: System, tmp_path: Path) -> None:
    port = free_port()
    kas = system.kas(wait_ready=False, redis={"server": {"address": f"127.0.0.1:{port}"}, "dial_timeout": "0.5s"})
    status, text = kas.readiness()
    assert status == 503 and "not ready" in text
    assert http_get(f"http://127.0.0.1:{kas.ports['observability']}/liveness")[0] == 200
    redis = RedisServer(tmp_path / "redis", port=port).start()
    try:
        deadline = time.monotonic() + 20
        while kas.readiness()[0] != 200:
            assert time.monotonic() < deadline, kas.readiness()
            time.sleep(0.2)
    finally:
        redis.stop()
    deadline = time.monotonic() + 20
    while kas.readiness()[0] == 200:
        assert time.monotonic() < deadline, "readiness must turn false again when Redis goes away"
        time.sleep(0.2)


def test_metrics_are_prometheus_text(system: System) -> None:
    kas = system.kas(use_redis=False)
    status, body = http_get(f"http://127.0.0.1:{kas.ports['observability']}/metrics")
    assert status == 200
    for name in ("tunnels_idle", "tunnel_find_requests_waiting", "connected_agents_count"):
        assert f"# TYPE {name} gauge" in body
    assert "# TYPE k8s_api_proxy_routing_duration_seconds histogram" in body
    # The supervisor's restart counter (issue 24 item 3): every background loop registered, none restarted.
    assert "# TYPE tether_kas_background_loop_restarts_total counter" in body


def test_config_errors_are_reported_without_traceback(tmp_path: Path) -> None:
    config = tmp_path / "kas.yaml"
    config.write_text("gitlab: {authentication_secret_file: /nope}\napi: {listen: {authentication_secret_file: /x}}\n")
    result = subprocess.run(
        [TETHER, "kas", "--configuration-file", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "private_api: Field required" in result.stderr
    assert "Traceback" not in result.stderr
    config.write_text(
        "gitlab: {authentication_secret_file: /nope}\n"
        "api: {listen: {authentication_secret_file: /nope}}\n"
        "private_api: {listen: {authentication_secret_file: /nope}}\n"
    )
    result = subprocess.run(
        [TETHER, "kas", "--configuration-file", str(config)], capture_output=True, text=True, check=False
    )
    assert "cannot read secret file /nope" in result.stderr and "Traceback" not in result.stderr
