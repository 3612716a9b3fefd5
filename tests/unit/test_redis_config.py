"""kas' ``redis`` section: one server or Redis Sentinel, passwords from files, TLS (issue 26 item 1, kas.md §3.1)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tether.kas.app import KasStartError, redis_target
from tether.kas.config import KasConfig
from tether.modserver.config import sentinel_host_port
from tether.tool.redis_pool import RedisTarget, SentinelMaster, TlsFiles

BASE: dict[str, Any] = {
    "gitlab": {"authentication_secret_file": "/s"},
    "api": {"listen": {"authentication_secret_file": "/s"}},
    "private_api": {"listen": {"authentication_secret_file": "/p"}},
}


def config(redis: dict[str, Any]) -> KasConfig:
    return KasConfig.model_validate({**BASE, "redis": redis})


def test_sentinel_section_as_upstream_names_it(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("data-secret\n")
    (tmp_path / "spw").write_text("sentinel-secret\n")
    cfg = config(
        {
            "sentinel": {
                "master_name": "gitlab-redis",
                "addresses": ["10.0.0.1:26379", "tcp://redis-2.example:26380", "[fd00::3]:26379"],
                "sentinel_password_file": str(tmp_path / "spw"),
            },
            "password_file": str(tmp_path / "pw"),
            "username": "kas",
            "database_index": 3,
        }
    )
    assert redis_target(cfg) == RedisTarget(
        sentinel=SentinelMaster(
            "gitlab-redis",
            (("10.0.0.1", 26379), ("redis-2.example", 26380), ("fd00::3", 26379)),
            "sentinel-secret",
        ),
        username="kas",
        password="data-secret",
        db=3,
    )


def test_one_server_keeps_credentials_out_of_the_url(tmp_path: Path) -> None:
    # A password with URL syntax in it (@, /, :) must not break the address.
    (tmp_path / "pw").write_text("p@ss/w:rd\n")
    target = redis_target(config({"server": {"address": "redis:6379"}, "password_file": str(tmp_path / "pw")}))
    assert target == RedisTarget(url="redis://redis:6379/0", password="p@ss/w:rd")


def test_tls_to_server_and_sentinels(tmp_path: Path) -> None:
    tls = {"enabled": True, "ca_certificate_file": "/ca.pem", "certificate_file": "/c.pem", "key_file": "/k.pem"}
    target = redis_target(config({"server": {"address": "redis:6380"}, "tls": tls}))
    assert target is not None and target.url == "rediss://redis:6380/0"
    assert target.tls == TlsFiles(Path("/ca.pem"), Path("/c.pem"), Path("/k.pem"))
    kwargs = target.tls.connection_kwargs()
    assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == (ssl.CERT_REQUIRED, True)
    sentinel = redis_target(config({"sentinel": {"master_name": "m", "addresses": ["s:26379"]}, "tls": tls}))
    assert sentinel is not None and sentinel.tls == target.tls
    assert redis_target(config({"server": {"address": "r:1"}, "tls": {"enabled": False}})) == RedisTarget(
        url="redis://r:1/0"
    )


@pytest.mark.parametrize(
    ("redis", "message"),
    [
        ({}, "exactly one of redis.server and redis.sentinel"),
        (
            {"server": {"address": "r:1"}, "sentinel": {"master_name": "m", "addresses": ["s:1"]}},
            "exactly one of redis.server and redis.sentinel",
        ),
        ({"sentinel": {"master_name": "", "addresses": ["s:1"]}}, "master_name"),
        ({"sentinel": {"master_name": "m", "addresses": []}}, "addresses"),
        ({"sentinel": {"master_name": "m", "addresses": ["s"]}}, "is not host:port"),
        ({"sentinel": {"master_name": "m", "addresses": ["s:0"]}}, "is not host:port"),
        ({"sentinel": {"master_name": "m", "addresses": ["s:65536"]}}, "is not host:port"),
        ({"sentinel": {"master_name": "m", "addresses": ["redis://s:26379"]}}, "is not host:port"),
        ({"sentinel": {"master_name": "m", "addresses": ["s:1"]}, "network": "unix"}, "network unix"),
        ({"server": {"address": "r:1"}, "tls": {"enabled": True, "key_file": "/k"}}, "set together"),
        ({"sentinel": {"master_name": "m", "addresses": ["s:1"], "password": "inline"}}, "password"),
    ],
)
def test_bad_redis_sections_are_refused(redis: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(redis)


def test_unreadable_sentinel_password_file_stops_kas(tmp_path: Path) -> None:
    cfg = config(
        {
            "sentinel": {
                "master_name": "m",
                "addresses": ["s:1"],
                "sentinel_password_file": str(tmp_path / "missing"),
            }
        }
    )
    with pytest.raises(KasStartError, match=r"redis\.sentinel\.sentinel_password_file"):
        redis_target(cfg)


def test_sentinel_host_port() -> None:
    assert sentinel_host_port("tcp://[::1]:26379") == ("::1", 26379)
    with pytest.raises(ValueError, match="is not host:port"):
        sentinel_host_port("s:26379/0")
