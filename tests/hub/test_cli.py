"""``tether hub``: the real command line, as a person or a script uses it."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from pathlib import Path

import click
import httpx
import yaml
from click.testing import CliRunner

from tests.fixtures.system import TETHER
from tether.hub.command import hub as hub_group
from tether.hub.db.migrate import head_revision
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, mint
from tether_devenv.process import ManagedProcess, free_port


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


def test_help_on_every_command() -> None:
    runner = CliRunner()
    paths = _commands(hub_group)
    assert ("serve",) in paths and ("agent", "register") in paths and ("migrate",) in paths
    for path in paths:
        result = runner.invoke(hub_group, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output and len(result.output.splitlines()) > 3, path


def tether(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([TETHER, *args], check=False, capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_cli_bootstrap_register_configure_and_serve(hub_database_url: str, tmp_path: Path) -> None:
    secret = os.urandom(32)
    secret_file = tmp_path / "gitlab_secret"
    secret_file.write_text(base64.b64encode(secret).decode())
    config_file = tmp_path / "hub.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{free_port()}",  # the environment overrides this one
                "database": {"url": hub_database_url, "auto_migrate": False},
                "gitlab": {"authentication_secret_file": str(secret_file)},
            }
        )
    )
    port = free_port()
    env = dict(os.environ, TETHER_HUB_LISTEN=f"127.0.0.1:{port}")
    hub = ("hub", "--config", str(config_file))

    refused = tether(*hub, "project", "list", check=False)
    assert refused.returncode == 1 and "tether hub migrate" in refused.stderr
    assert f"at revision {head_revision()}" in tether(*hub, "migrate").stderr

    admin_token = tether(*hub, "bootstrap").stdout.strip()
    assert admin_token.startswith("glpat-") and "\n" not in admin_token
    assert "shown only once" in tether(*hub, "bootstrap", "--token-name", "second").stderr
    tether(*hub, "user", "create", "dora", "--name", "Dora")
    tether(*hub, "group", "create", "platform", "--owner", "dora")
    tether(*hub, "project", "create", "platform/clusters", "--maintainer", "dora")
    agent_token = tether(*hub, "agent", "register", "platform/clusters", "prod").stdout.strip()
    assert agent_token.startswith("glagent-")
    duplicate = tether(*hub, "agent", "register", "platform/clusters", "prod", check=False)
    assert duplicate.returncode == 1 and "has already been taken" in duplicate.stderr
    too_long = tether(*hub, "agent", "register", "platform/clusters", "x" * 64, check=False)
    assert too_long.returncode == 1 and "maximum is 63" in too_long.stderr

    config = tmp_path / "agent.yaml"
    config.write_text("user_access:\n  access_as: {agent: {}}\n  projects: [{id: platform/clusters}]\n")
    assert "version 1" in tether(*hub, "agent", "config-set", "platform/clusters", "prod", str(config)).stdout
    config.write_text("starboard: {}\nuser_access:\n  access_as: {agent: {}}\n")
    gitlab = tether(*hub, "agent", "config-set", "platform/clusters", "prod", str(config))
    assert "version 2" in gitlab.stdout and "warning: configuration.starboard: accepted but not" in gitlab.stderr
    config.write_text("user_access:\n  access_as: {agent: {}}\n  projects: [{id: platform/clusters}]\n")
    assert "version 3" in tether(*hub, "agent", "config-set", "platform/clusters", "prod", str(config)).stdout
    config.write_text("user_access:\n  access_as: agent\n")
    bad = tether(*hub, "agent", "config-set", "platform/clusters", "prod", str(config), check=False)
    assert bad.returncode == 1 and "user_access.access_as" in bad.stderr
    assert (
        "projects: [{id: platform/clusters}]"
        in tether(*hub, "agent", "config-show", "platform/clusters", "prod").stdout
    )
    assert "prod" in tether(*hub, "agent", "list", "platform/clusters").stdout
    assert "platform/clusters" in tether(*hub, "project", "list").stdout
    assert "dora" in tether(*hub, "member", "list", "platform/clusters").stdout
    listing = tether(*hub, "token", "list").stdout
    assert "bootstrap" in listing and admin_token not in listing

    log = tmp_path / "serve.log"
    server = ManagedProcess("hub", [TETHER, *hub, "serve"], log, env=env)
    server.start()
    try:
        base = f"http://127.0.0.1:{port}"
        server.wait_ready(lambda: httpx.get(f"{base}/-/health").status_code == 200, 60, "healthy")
        user = httpx.get(f"{base}/api/v4/user", headers={"PRIVATE-TOKEN": admin_token})
        assert user.status_code == 200 and user.json()["username"] == "root"
        headers = {
            "Gitlab-Kas-Api-Request": mint(secret, ISSUER_KAS, AUDIENCE_GITLAB, 30),
            "Authorization": f"Bearer {agent_token}",
        }
        info = httpx.get(f"{base}/api/v4/internal/kubernetes/agent_info", headers=headers)
        assert info.status_code == 200 and info.json()["agent_name"] == "prod"
        assert httpx.get(f"{base}/openapi.json").json()["info"]["title"] == "Tether hub"
    finally:
        server.stop()
    assert server.popen is not None and server.popen.returncode == 0
    text = log.read_text()
    assert "GET /api/v4/user 200" in text and "hub ready" in text
    assert admin_token not in text and agent_token not in text


def test_cli_errors_name_the_problem(tmp_path: Path) -> None:
    result = tether("hub", "--database-url", "mysql://db/hub", "migrate", check=False)
    assert result.returncode == 1 and "database.url" in result.stderr and "not supported" in result.stderr
    config = tmp_path / "bad.yaml"
    config.write_text("listen: 127.0.0.1:1\ndatabse: {}\n")
    result = tether("hub", "--config", str(config), "migrate", check=False)
    assert result.returncode == 1 and "databse: unknown field" in result.stderr
    secret = tmp_path / "short"
    secret.write_text(base64.b64encode(b"x" * 16).decode())
    env = dict(os.environ, TETHER_HUB_GITLAB_SECRET_FILE=str(secret))
    result = tether(
        "hub", "--data-dir", str(tmp_path / "d"), "serve", "--listen", f"127.0.0.1:{free_port()}", env=env, check=False
    )
    assert result.returncode == 1 and "expected 32" in result.stderr


def test_embedded_default_creates_its_data_dir_and_secret(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    server = ManagedProcess(
        "hub", [TETHER, "hub", "--data-dir", str(data), "serve", "--listen", f"127.0.0.1:{port}"], tmp_path / "log"
    )
    server.start()
    try:
        server.wait_ready(lambda: httpx.get(f"http://127.0.0.1:{port}/-/health").status_code == 200, 60, "healthy")
    finally:
        server.stop()
    assert (data / "hub.db").exists()
    assert len(base64.b64decode((data / "gitlab_secret").read_text())) == 32
    assert (data / "gitlab_secret").stat().st_mode & 0o077 == 0


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = tether("hub", "--data-dir", str(tmp_path), "serve", "--listen", f"127.0.0.1:{port}", check=False)
    assert result.returncode == 1 and "could not start" in result.stderr and "address already in use" in result.stderr
