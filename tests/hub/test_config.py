"""The hub configuration: defaults, file, environment and command-line precedence, errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.hub.config import ConfigError, load_config


def test_defaults_are_the_embedded_setup(tmp_path: Path) -> None:
    config = load_config(None, environ={}, overrides={"data_dir": str(tmp_path)})
    assert config.database_url == f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}"
    assert config.gitlab_secret_file == tmp_path / "gitlab_secret"
    assert config.kas_secret_file == config.gitlab_secret_file
    assert config.listen == "127.0.0.1:8080" and config.base_url == "http://127.0.0.1:8080"
    assert config.database.auto_migrate and config.kas.api_address is None


def test_precedence_file_then_environment_then_options(tmp_path: Path) -> None:
    path = tmp_path / "hub.yaml"
    path.write_text(
        "listen: 0.0.0.0:9000\n"
        "external_url: https://hub.example.com/\n"
        "database: {url: 'postgresql+asyncpg://hub@db:5432/hub', auto_migrate: false}\n"
        "kas: {api_address: 'kas:8153', timeout: 5s}\n"
    )
    config = load_config(path, environ={})
    assert config.listen == "0.0.0.0:9000" and config.base_url == "https://hub.example.com"
    assert config.database_url.startswith("postgresql+asyncpg://") and not config.database.auto_migrate
    assert config.kas.timeout == 5.0

    env = {"TETHER_HUB_LISTEN": "127.0.0.1:9100", "TETHER_HUB_AUTO_MIGRATE": "true", "TETHER_HUB_LOG_LEVEL": "debug"}
    config = load_config(path, environ=env)
    assert config.listen == "127.0.0.1:9100" and config.database.auto_migrate and config.logging.level == "debug"

    config = load_config(path, environ=env, overrides={"listen": "127.0.0.1:9200", "kas.api_address": None})
    assert config.listen == "127.0.0.1:9200" and config.kas.api_address == "kas:8153"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("lisen: 1.2.3.4:5\n", "lisen: unknown field"),
        ("kas: {timeout: soon}\n", "kas.timeout"),
        ("database: {url: 'mysql://db/hub'}\n", "database.url"),
        ("database: {url: 'postgresql://db/hub'}\n", "postgresql+asyncpg"),
        ("listen: nowhere\n", "listen"),
        ("logging: {level: loud}\n", "logging.level"),
        ("- a\n", "mapping"),
        ("listen: [\n", "not valid YAML"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "hub.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert problem in str(error.value) and str(path) in str(error.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml", environ={})
