"""Pure rules of the Kubernetes API proxy: headers, credentials, impersonation, Status, CORS (kas.md §4.5, §5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import yaml
from multidict import CIMultiDict, MultiDict

from tether.kas.config import ConfigError, KasConfig, load_config
from tether.modserver.gitlab_client import (
    GitlabClientError,
    ProxyUserAuthorization,
    RoleGrant,
    _proxy_user_authorization,
)
from tether.modules.kubernetes_api.rpc.impersonation import carries_impersonation, impersonation_headers
from tether.modules.kubernetes_api.server.auth import (
    _CACHE_SIZE,
    PAT_ACCESS,
    SESSION_ACCESS,
    ProxyCredentials,
    ProxyUserAuthorizer,
    credentials_from,
    impersonation_for,
)
from tether.modules.kubernetes_api.server.cors import cors_headers, is_preflight, preflight_response
from tether.modules.kubernetes_api.server.status import ProxyError, status_body
from tether.tool.http_grpc.headers import canonical_key, clean_headers, is_upgrade
from tether.tunnel.server.metadata import ROUTING_AGENT_ID_KEY, RoutingMetadataError, routing_agent_id


def creds(headers: dict[str, str] | list[tuple[str, str]], query: str = "", cookies: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    q: MultiDict[str] = MultiDict()
    for part in filter(None, query.split("&")):
        k, _, v = part.partition("=")
        q.add(k, v)
    return credentials_from(CIMultiDict(headers), q, cookies or {})


def test_canonical_header_keys_follow_go() -> None:
    assert canonical_key("content-type") == "Content-Type"
    assert canonical_key("X-CSRF-TOKEN") == "X-Csrf-Token"
    assert canonical_key("impersonate-extra-agent.gitlab.com%2Fid") == "Impersonate-Extra-Agent.gitlab.com%2fid"


def test_clean_headers_drops_hop_by_hop_host_and_listed_ones() -> None:
    pairs = [
        ("Host", "kas"),
        ("Connection", "keep-alive, X-Private"),
        ("X-Private", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("Te", "trailers"),
        ("accept", "application/json"),
        ("Accept", "application/yaml"),
        ("Authorization", "Bearer pat:1:x"),
    ]
    assert clean_headers(pairs, drop=["authorization"]) == {"Accept": ["application/json", "application/yaml"]}


def test_clean_headers_keeps_an_upgrade() -> None:
    pairs = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v4.channel.k8s.io")]
    assert is_upgrade(pairs)
    assert clean_headers(pairs) == {
        "X-Stream-Protocol-Version": ["v4.channel.k8s.io"],
        "Upgrade": ["SPDY/3.1"],
        "Connection": ["upgrade"],
    }
    assert not is_upgrade([("Upgrade", "websocket")])  # no Connection: upgrade


def test_pat_credentials() -> None:
    c = creds({"Authorization": "Bearer pat:42:glpat-abc:def"})
    assert (c.agent_id, c.access_type, c.access_key, c.csrf_token) == (42, PAT_ACCESS, "glpat-abc:def", "")


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({}, "no credentials"),
        ({"Authorization": "Basic abc"}, "Bearer pat:<agent id>"),
        ({"Authorization": "Bearer tok"}, "unknown token type"),
        ({"Authorization": "Bearer ci:1:job"}, "CI job tokens"),
        ({"Authorization": "Bearer pat:x:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:0:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:9223372036854775808:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:\u00b2:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:\u0661:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:+5:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:5_0:tok"}, "not a positive decimal"),
        ({"Authorization": "Bearer pat:5:"}, "empty token"),
        ([("Authorization", "Bearer pat:5:a"), ("Authorization", "Bearer pat:5:a")], "exactly one Authorization"),
    ],
)
def test_bad_credentials_are_401_with_the_marker_header(headers: dict[str, str], fragment: str) -> None:
    with pytest.raises(ProxyError) as caught:
        creds(headers)
    assert caught.value.code == 401
    assert caught.value.headers == {"Gitlab-Unauthorized": "true"}
    assert fragment in caught.value.message


@pytest.mark.parametrize("agent_id", ["\u00b2", "9223372036854775808", "1" * 400])
def test_session_agent_id_must_be_ascii_and_in_range(agent_id: str) -> None:
    with pytest.raises(ProxyError) as caught:
        creds({"Gitlab-Agent-Id": agent_id, "X-Csrf-Token": "c"}, cookies={"_gitlab_kas": "s"})
    assert caught.value.code == 401 and "not a positive decimal" in caught.value.message


def test_routing_agent_id_must_be_ascii_and_in_range() -> None:
    for bad in ("\u00b2", "9223372036854775808", "-1", "0", " 1"):
        with pytest.raises(RoutingMetadataError):
            routing_agent_id([(ROUTING_AGENT_ID_KEY, bad)])
    assert routing_agent_id([(ROUTING_AGENT_ID_KEY, "9223372036854775807")]) == 2**63 - 1


def test_session_cookie_credentials_from_headers_or_query() -> None:
    c = creds({"Gitlab-Agent-Id": "7", "X-Csrf-Token": "csrf"}, cookies={"_gitlab_kas": "se%2Fss"})
    assert (c.agent_id, c.access_type, c.access_key, c.csrf_token) == (7, SESSION_ACCESS, "se/ss", "csrf")
    c = creds({}, query="gitlab-agent-id=8&gitlab-csrf-token=t", cookies={"_gitlab_kas": "s"})
    assert (c.agent_id, c.csrf_token) == (8, "t")
    with pytest.raises(ProxyError, match="exactly one agent id"):
        creds({"Gitlab-Agent-Id": "7"}, query="gitlab-agent-id=7", cookies={"_gitlab_kas": "s"})
    with pytest.raises(ProxyError, match="exactly one CSRF token"):
        creds({"Gitlab-Agent-Id": "7"}, cookies={"_gitlab_kas": "s"})


def test_authorize_answer_parsing_and_user_impersonation() -> None:
    auth = _proxy_user_authorization(
        {
            "agent": {"id": 5, "config_project": {"id": 11}},
            "user": {"id": 3, "username": "alice"},
            "access_as": {
                "user": {
                    "projects": [{"id": 11, "roles": ["developer", "reporter"]}],
                    "groups": [{"id": 2, "roles": ["maintainer"]}],
                }
            },
        }
    )
    assert auth == ProxyUserAuthorization(
        5, 11, 3, "alice", True, (RoleGrant(11, ("developer", "reporter")),), (RoleGrant(2, ("maintainer",)),)
    )
    config = impersonation_for(auth, PAT_ACCESS)
    assert config is not None
    assert config.username == "gitlab:user:alice"
    assert list(config.groups) == [
        "gitlab:user",
        "gitlab:project_role:11:developer",
        "gitlab:project_role:11:reporter",
        "gitlab:group_role:2:maintainer",
    ]
    assert {e.key: list(e.val) for e in config.extra} == {
        "agent.gitlab.com/id": ["5"],
        "agent.gitlab.com/username": ["alice"],
        "agent.gitlab.com/access_type": ["personal_access_token"],
        "agent.gitlab.com/config_project_id": ["11"],
    }
    headers = impersonation_headers(config)
    assert ("Impersonate-User", "gitlab:user:alice") in headers
    assert headers.count(("Impersonate-Group", "gitlab:user")) == 1
    assert ("Impersonate-Extra-agent.gitlab.com%2Fid", "5") in headers
    agent_auth = _proxy_user_authorization(
        {
            "agent": {"id": 5, "config_project": {"id": 11}},
            "user": {"id": 3, "username": "a"},
            "access_as": {"agent": {}},
        }
    )
    assert impersonation_for(agent_auth, PAT_ACCESS) is None


def test_impersonation_headers_are_detected_in_any_case() -> None:
    assert carries_impersonation(["Accept", "impersonate-user"]) == "impersonate-user"
    assert carries_impersonation(["Accept"]) is None


def test_status_body() -> None:
    assert status_body(504, "Agent connection not found.") == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "GitLab Agent Server: Agent connection not found.",
        "reason": "Timeout",
        "code": 504,
    }
    assert "reason" not in status_body(502, "x")


def test_cors() -> None:
    assert cors_headers(CIMultiDict(), "https://gitlab.example.com") == {}
    assert cors_headers(CIMultiDict({"Origin": "https://x"}), None) == {}
    allowed = cors_headers(CIMultiDict({"Origin": "https://gitlab.example.com"}), "https://gitlab.example.com/")
    assert allowed["Access-Control-Allow-Origin"] == "https://gitlab.example.com"
    assert allowed["Access-Control-Allow-Credentials"] == "true"
    with pytest.raises(ProxyError) as caught:
        cors_headers(CIMultiDict({"Origin": "https://evil.example"}), "https://gitlab.example.com")
    assert caught.value.code == 403
    preflight = CIMultiDict(
        {
            "Origin": "https://gitlab.example.com",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "x-csrf-token, gitlab-agent-id",
        }
    )
    assert is_preflight("OPTIONS", preflight)
    answer = preflight_response(preflight, allowed)
    assert answer.status == 200
    assert answer.headers["Access-Control-Allow-Headers"] == "x-csrf-token, gitlab-agent-id"
    assert "PATCH" in answer.headers["Access-Control-Allow-Methods"]
    assert answer.headers["Access-Control-Max-Age"] == "86400"


def test_config_section_is_off_unless_present(tmp_path: Path) -> None:
    base = {
        "gitlab": {"authentication_secret_file": "/s"},
        "api": {"listen": {"authentication_secret_file": "/s"}},
        "private_api": {"listen": {"authentication_secret_file": "/p"}},
    }
    assert KasConfig.model_validate(base).agent.kubernetes_api is None
    section = KasConfig.model_validate({**base, "agent": {"kubernetes_api": {}}}).agent.kubernetes_api
    assert section is not None
    assert (section.listen.address, section.url_path_prefix) == ("0.0.0.0:8154", "/")
    assert (section.allowed_agent_cache_ttl, section.allowed_agent_cache_error_ttl) == (60.0, 10.0)
    assert (section.listen.listen_grace_period, section.listen.shutdown_grace_period) == (5.0, 3600.0)
    tuned = {"kubernetes_api": {"url_path_prefix": "/k8s-proxy", "allowed_agent_cache_ttl": "2m"}}
    section = KasConfig.model_validate({**base, "agent": tuned}).agent.kubernetes_api
    assert section is not None and section.url_path_prefix == "/k8s-proxy/" and section.allowed_agent_cache_ttl == 120
    path = tmp_path / "kas.yaml"
    path.write_text(yaml.safe_dump({**base, "agent": {"kubernetes_api": {"url_path_prefix": "k8s"}}}))
    with pytest.raises(ConfigError, match=r"agent\.kubernetes_api\.url_path_prefix: .*must start with '/'"):
        load_config(path)


class FakeHub:
    """Counts ``authorize_proxy_user`` calls and answers from a script."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def authorize_proxy_user(self, agent_id: int, access_type: str, access_key: str, csrf_token: str) -> object:
        self.calls += 1
        await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


ALLOWED = ProxyUserAuthorization(5, 11, 3, "alice", False)
PAT = ProxyCredentials(5, PAT_ACCESS, "glpat-x")


async def test_authorizer_caches_answers_and_shares_concurrent_lookups() -> None:
    now = [100.0]
    hub = FakeHub(ALLOWED)
    authorizer = ProxyUserAuthorizer(hub, 60, 10, clock=lambda: now[0])  # type: ignore[arg-type]
    hub.gate.clear()
    first = asyncio.ensure_future(authorizer.authorize(PAT))
    second = asyncio.ensure_future(authorizer.authorize(PAT))
    await asyncio.sleep(0)
    hub.gate.set()
    assert await first == await second == ALLOWED
    assert hub.calls == 1
    now[0] += 59
    assert await authorizer.authorize(PAT) == ALLOWED
    assert hub.calls == 1
    now[0] += 2
    await authorizer.authorize(PAT)
    assert hub.calls == 2
    await authorizer.authorize(ProxyCredentials(5, PAT_ACCESS, "glpat-other"))
    assert hub.calls == 3


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_authorizer_maps_hub_refusals_to_401_and_caches_them(status: int) -> None:
    now = [0.0]
    hub = FakeHub(GitlabClientError(status, "/authorize_proxy_user", "no"))
    authorizer = ProxyUserAuthorizer(hub, 60, 10, clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(ProxyError) as caught:
            await authorizer.authorize(PAT)
        assert caught.value.code == 401 and caught.value.headers == {"Gitlab-Unauthorized": "true"}
    assert hub.calls == 1
    now[0] += 11
    with pytest.raises(ProxyError):
        await authorizer.authorize(PAT)
    assert hub.calls == 2


async def test_authorizer_does_not_cache_hub_failures() -> None:
    hub = FakeHub(GitlabClientError(502, "/authorize_proxy_user", "bad gateway"))
    authorizer = ProxyUserAuthorizer(hub, 60, 10)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(ProxyError) as caught:
            await authorizer.authorize(PAT)
        assert caught.value.code == 500 and "hub answered HTTP 502" in caught.value.message
    assert hub.calls == 2
    hub.answer = aiohttp.ClientConnectionError("refused")
    with pytest.raises(ProxyError, match="unreachable"):
        await authorizer.authorize(PAT)


async def test_authorizer_caches_are_bounded() -> None:
    """Issue 9 item 4: an attacker cycling through fresh tokens must not grow kas' memory without bound."""
    hub = FakeHub(GitlabClientError(401, "/authorize_proxy_user", "no"))
    authorizer = ProxyUserAuthorizer(hub, 60, 3600)  # type: ignore[arg-type]
    for index in range(_CACHE_SIZE + 500):
        with pytest.raises(ProxyError):
            await authorizer.authorize(ProxyCredentials(5, PAT_ACCESS, f"glpat-{index}"))
    assert authorizer._refusals is not None and len(authorizer._refusals) <= _CACHE_SIZE
    hub.answer = ALLOWED
    for index in range(_CACHE_SIZE + 500):
        await authorizer.authorize(ProxyCredentials(5, PAT_ACCESS, f"glpat-ok-{index}"))
    assert authorizer._cache is not None and len(authorizer._cache) <= _CACHE_SIZE
