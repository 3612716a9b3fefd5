"""Pure rules of workspace access: addresses, header rules, sign-in tokens, credentials, cached authorization."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from tether.kas.config import ConfigError, KasConfig, load_config
from tether.modserver.gitlab_client import GitlabClientError, WorkspaceAuthorization
from tether.modules.workspace_access import ACCESS_PAT, ACCESS_SESSION, SESSION_COOKIE, STATE_COOKIE
from tether.modules.workspace_access.rpc.headers import (
    KAS_SET_HEADERS,
    request_headers,
    response_headers,
    workspace_cookies,
    workspace_request_headers,
)
from tether.modules.workspace_access.rpc.tokens import (
    AuthorizeRequest,
    SignInCode,
    WorkspaceSession,
    new_nonce,
    nonce_digest,
    nonce_matches,
)
from tether.modules.workspace_access.server.addresses import AddressBook, AddressError
from tether.modules.workspace_access.server.authorizer import AccessRefused, WorkspaceAuthorizer
from tether.modules.workspace_access.server.credentials import Credentials, CredentialsError, read_credentials
from tether.modules.workspace_access.server.sign_in import SignIn, _local
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, JwtError, mint, verify

SECRET = os.urandom(32)
BOOK = AddressBook(["workspaces.example.com", "ws.test"], "https", "http://127.0.0.1:8156")


# ---- addresses -------------------------------------------------------------------------------------------


def test_host_form_names_port_and_workspace() -> None:
    address = BOOK.parse(["60001-my-ws.workspaces.example.com"], "/index.html?folder=%2Fprojects&a=1")
    assert (address.name, address.port, address.zone) == ("my-ws", 60001, "workspaces.example.com")
    assert (address.path, address.query, address.prefix) == ("/index.html", "folder=%2Fprojects&a=1", None)
    assert address.origin == "https://60001-my-ws.workspaces.example.com"
    assert address.request_target == "/index.html?folder=%2Fprojects&a=1"


def test_host_form_keeps_a_port_and_upper_case_is_folded() -> None:
    address = BOOK.parse(["8080-WS.ws.test:8443"], "/")
    assert (address.name, address.port, address.host, address.origin) == (
        "ws",
        8080,
        "8080-ws.ws.test:8443",
        "https://8080-ws.ws.test:8443",
    )


def test_path_form_strips_its_prefix_and_keeps_the_raw_path() -> None:
    address = BOOK.parse(["127.0.0.1:8156"], "/-/workspaces/my-ws/60001/a%2Fb/../c?x=1")
    assert (address.name, address.port, address.zone) == ("my-ws", 60001, None)
    assert (address.prefix, address.path, address.query) == ("/-/workspaces/my-ws/60001", "/a%2Fb/../c", "x=1")
    assert address.origin == "http://127.0.0.1:8156"
    assert address.request_target == "/-/workspaces/my-ws/60001/a%2Fb/../c?x=1"


def test_path_form_without_the_trailing_slash_redirects() -> None:
    with pytest.raises(AddressError) as caught:
        BOOK.parse(["127.0.0.1:8156"], "/-/workspaces/my-ws/60001?x=1")
    assert (caught.value.code, caught.value.location) == (308, "/-/workspaces/my-ws/60001/?x=1")


def test_the_callback_on_both_forms() -> None:
    assert BOOK.parse(["60001-a.ws.test"], "/-/workspaces/-/callback?code=x").callback
    assert BOOK.parse(["127.0.0.1:8156"], "/-/workspaces/-/callback?code=x").callback


@pytest.mark.parametrize(
    ("hosts", "target", "code"),
    [
        ([], "/", 400),  # no Host
        (["60001-a.ws.test", "60001-b.ws.test"], "/", 400),  # two Host headers
        (["60001-a.ws.test\r\nX-Injected: 1"], "/", 400),  # header injection
        (["60001-a.ws.test\nX: 1"], "/", 400),
        (["60001-a.ws.test/evil"], "/", 400),
        (["user@60001-a.ws.test"], "/", 400),
        (["60001-a.ws.test:80:80"], "/", 400),
        (["60001-a..ws.test"], "/", 400),
        (["60001-a%2e.ws.test"], "/", 400),
        (["60001-а.ws.test"], "/", 400),  # Cyrillic a
        (["evil.com"], "/", 421),  # a host kas does not serve
        (["ws.test"], "/", 421),  # the zone itself
        (["127.0.0.1:9999"], "/-/workspaces/a/60001/", 421),  # path form on another port
        (["a.ws.test"], "/", 404),  # no port
        (["0-a.ws.test"], "/", 404),
        (["060001-a.ws.test"], "/", 404),
        (["70000-a.ws.test"], "/", 404),
        (["60001-.ws.test"], "/", 404),
        (["60001-a-.ws.test"], "/", 404),
        (["60001-a.b.ws.test"], "/", 404),  # two labels before the zone
        (["60001-" + "a" * 64 + ".ws.test"], "/", 404),
        (["60001-a.ws.test"], "http://evil.com/", 400),  # absolute form
        (["60001-a.ws.test"], "//evil.com/", 400),
        (["127.0.0.1:8156"], "/", 404),  # path form outside the prefix
        (["127.0.0.1:8156"], "/-/workspaces/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/a/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/A/60001/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/a/0/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/a/99999/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/a%2Fb/60001/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/../60001/", 404),
        (["127.0.0.1:8156"], "/-/workspaces/a/6e4/", 404),
    ],
)
def test_what_names_no_workspace_is_refused_with_a_4xx(hosts: list[str], target: str, code: int) -> None:
    with pytest.raises(AddressError) as caught:
        BOOK.parse(hosts, target)
    assert caught.value.code == code
    assert caught.value.message  # says what is wrong


def test_without_path_url_there_is_no_path_form() -> None:
    with pytest.raises(AddressError) as caught:
        AddressBook(["ws.test"], "http", None).parse(["127.0.0.1:8156"], "/-/workspaces/a/60001/")
    assert caught.value.code == 421


def test_a_zone_inside_another_zone_wins() -> None:
    book = AddressBook(["example.com", "ws.example.com"], "https", None)
    assert book.parse(["60001-a.ws.example.com"], "/").zone == "ws.example.com"


# ---- header rules ----------------------------------------------------------------------------------------


def test_credentials_and_kas_cookies_never_reach_the_workspace() -> None:
    pairs = [
        ("Host", "60001-a.ws.test"),
        ("Authorization", "Bearer secret-token"),
        ("Proxy-Authorization", "Basic eA=="),
        ("Cookie", f"theme=dark; {SESSION_COOKIE}=ey.secret; {STATE_COOKIE}=n"),
        ("Cookie", f"{SESSION_COOKIE}=other"),
        ("X-Forwarded-Host", "evil.com"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "1"),
        ("Accept", "text/html"),
    ]
    headers = request_headers(pairs, "60001-a.ws.test", "https", "192.0.2.7", None)
    assert "Authorization" not in headers and "Proxy-Authorization" not in headers
    assert headers["Cookie"] == ["theme=dark"]
    assert headers["Host"] == ["60001-a.ws.test"]
    assert headers["X-Forwarded-Host"] == ["60001-a.ws.test"]
    assert headers["X-Forwarded-Proto"] == ["https"]
    assert headers["X-Forwarded-For"] == ["10.0.0.1, 192.0.2.7"]
    assert "X-Hop" not in headers and "Connection" not in headers
    assert headers["Accept"] == ["text/html"]
    assert "X-Forwarded-Prefix" not in headers
    assert "secret" not in repr(headers)


def test_only_tether_cookies_leave_the_cookie_header() -> None:
    assert workspace_cookies([f"{SESSION_COOKIE}=x", f"a=1;{STATE_COOKIE}=y; b=2"]) == ["a=1; b=2"]
    assert workspace_cookies([f" {SESSION_COOKIE} =x"]) == []
    # The hub's session cookies (issue 27 item 2), any future name of Tether's namespaces, any spelling.
    hub = "_gitlab_session=s1; _gitlab_kas=s1; __Host-_gitlab_session=s2; __Secure-_Tether_x=3; _GITLAB_SID=4"
    assert workspace_cookies([hub, "gitlab=ok; tether_theme=ok; x_gitlab_session=ok"]) == [
        "gitlab=ok; tether_theme=ok; x_gitlab_session=ok"
    ]


def test_only_allowed_headers_reach_the_workspace() -> None:
    pairs = [
        ("Accept", "text/html"),
        ("Accept-Language", "en"),
        ("User-Agent", "browser"),
        ("Origin", "https://60001-a.ws.test"),
        ("Sec-WebSocket-Key", "k"),
        ("Sec-Fetch-Site", "same-origin"),
        ("X-XSRFToken", "app-own"),
        ("X-Requested-With", "XMLHttpRequest"),
        ("Cookie", "_gitlab_session=s; theme=dark"),
        ("Authorization", "Bearer t"),
        ("Proxy-Authorization", "Basic t"),
        ("Private-Token", "t"),
        ("Job-Token", "t"),
        ("Gitlab-Agent-Id", "1"),
        ("Gitlab-Csrf-Token", "t"),
        ("X-Csrf-Token", "t"),
        ("X-Gitlab-Token", "t"),
        ("X-Real-IP", "10.0.0.1"),
        ("Forwarded", "for=10.0.0.1"),
        ("X-Forwarded-Host", "evil.com"),
        ("Via", "1.1 evil"),
        ("Some-Unknown", "t"),
    ]
    headers = workspace_request_headers(pairs)
    assert sorted(headers) == [
        "Accept",
        "Accept-Language",
        "Cookie",
        "Origin",
        "Sec-Fetch-Site",
        "Sec-Websocket-Key",
        "User-Agent",
        "X-Requested-With",
        "X-Xsrftoken",
    ]
    assert headers["Cookie"] == ["theme=dark"]
    # agentk keeps what kas set, and nothing else of the reserved names.
    kept = workspace_request_headers([*pairs, ("X-Forwarded-Proto", "https")], keep=KAS_SET_HEADERS)
    assert kept["X-Forwarded-Host"] == ["evil.com"] and kept["X-Forwarded-Proto"] == ["https"]
    assert "X-Csrf-Token" not in kept and "Authorization" not in kept and "X-Real-Ip" not in kept


def test_path_form_tells_the_prefix_and_fixes_local_redirects() -> None:
    headers = request_headers([], "127.0.0.1:8156", "http", None, "/-/workspaces/a/60001")
    assert headers["X-Forwarded-Prefix"] == ["/-/workspaces/a/60001"]
    answer = response_headers({"Location": ["/login?x=1"]}, "/-/workspaces/a/60001")
    assert answer["Location"] == ["/-/workspaces/a/60001/login?x=1"]
    for elsewhere in ("https://other.example/", "//other.example/x", "relative"):
        assert response_headers({"Location": [elsewhere]}, "/-/workspaces/a/60001")["Location"] == [elsewhere]


def test_a_workspace_cannot_set_tether_cookies() -> None:
    answer = response_headers(
        {
            "Set-Cookie": [
                f"{SESSION_COOKIE}=attacker; Domain=ws.test",
                "editor=1; Path=/",
                f"{STATE_COOKIE}=x",
                "_gitlab_session=attacker; Domain=example.com; Path=/users",
                "__Host-_gitlab_kas=x; Path=/; Secure",
            ]
        },
        None,
    )
    assert answer["Set-Cookie"] == ["editor=1; Path=/"]
    assert "Set-Cookie" not in response_headers({"Set-Cookie": [f"{SESSION_COOKIE}=attacker"]}, None)


# ---- sign-in tokens --------------------------------------------------------------------------------------


def test_the_three_tokens_round_trip_and_are_not_interchangeable() -> None:
    nonce = new_nonce()
    asked = AuthorizeRequest("https://60001-a.ws.test/-/workspaces/-/callback", "/x?y=1", nonce_digest(nonce))
    request_token = asked.mint(SECRET)
    assert AuthorizeRequest.read(request_token, SECRET) == asked
    code = SignInCode(7, 42, int(time.time()) + 3600, asked)
    code_token = code.mint(SECRET)
    assert SignInCode.read(code_token, SECRET) == code
    session = WorkspaceSession(7, 42, int(time.time()) + 3600)
    cookie = session.mint(SECRET, time.time())
    assert WorkspaceSession.read(cookie, SECRET) == session
    assert nonce_matches(nonce, asked.nonce_sha256) and not nonce_matches(new_nonce(), asked.nonce_sha256)
    for reader, token in ((SignInCode.read, request_token), (WorkspaceSession.read, code_token)):
        with pytest.raises(JwtError):
            reader(token, SECRET)
    with pytest.raises(JwtError):
        AuthorizeRequest.read(cookie, SECRET)
    # None of them is a service JWT of the internal API.
    for token in (request_token, code_token, cookie):
        with pytest.raises(JwtError):
            verify(token, SECRET, AUDIENCE_GITLAB, ISSUER_KAS)
    with pytest.raises(JwtError):
        WorkspaceSession.read(cookie, os.urandom(32))


def test_tokens_refuse_expiry_and_bad_claims() -> None:
    past = WorkspaceSession(7, 42, int(time.time()) - 60).mint(SECRET, time.time() - 120)
    with pytest.raises(JwtError):
        WorkspaceSession.read(past, SECRET)
    evil = mint(SECRET, ISSUER_KAS, "tether-workspaces-authorize", 60, extra={"cb": "x", "ret": "//evil", "nh": "a"})
    with pytest.raises(JwtError, match="path"):
        AuthorizeRequest.read(evil, SECRET)
    odd = mint(SECRET, ISSUER_KAS, "tether-workspaces-session", 60, extra={"sub": "x", "sid": 1})
    with pytest.raises(JwtError):
        WorkspaceSession.read(odd, SECRET)


# ---- credentials ----------------------------------------------------------------------------------------


def test_credentials_bearer_token_cookie_or_none() -> None:
    token = read_credentials(CIMultiDict({"Authorization": "Bearer glpat-abc"}), {}, SECRET)
    assert token == (Credentials(ACCESS_PAT, "glpat-abc"), False)
    cookie = WorkspaceSession(1, 2, int(time.time()) + 60).mint(SECRET, time.time())
    assert read_credentials(CIMultiDict(), {SESSION_COOKIE: cookie}, SECRET) == (
        Credentials(ACCESS_SESSION, cookie),
        False,
    )
    assert read_credentials(CIMultiDict(), {SESSION_COOKIE: "forged"}, SECRET) == (None, True)
    assert read_credentials(CIMultiDict(), {}, SECRET) == (None, False)


@pytest.mark.parametrize(
    "values",
    [["Basic dXNlcjpwdw=="], ["Bearer "], ["Bearer a", "Bearer b"], ["Bearer a b"], ["Bearer " + "x" * 2000]],
)
def test_malformed_authorization_is_refused(values: list[str]) -> None:
    headers: CIMultiDict[str] = CIMultiDict()
    for value in values:
        headers.add("Authorization", value)
    with pytest.raises(CredentialsError):
        read_credentials(headers, {}, SECRET)


# ---- the cached authorizer -------------------------------------------------------------------------------


def _answer(name: str, state: str = "Running") -> WorkspaceAuthorization:
    return WorkspaceAuthorization(1, name, "ns", 5, 3, (60001,), state, "Running", "", 7, "alice")


class FakeHub:
    def __init__(self) -> None:
        self.calls = 0
        self.state = "Running"
        self.refuse: int | None = None
        self.gate: asyncio.Event | None = None

    async def authorize_workspace_user(self, name: str, zone: str | None, kind: str, key: str) -> Any:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse is not None:
            raise GitlabClientError(self.refuse, "/x", "no")
        return _answer(name, self.state)


async def test_answers_are_cached_shared_and_dropped_on_invalidation() -> None:
    hub = FakeHub()
    now = [0.0]
    authorizer = WorkspaceAuthorizer(hub, 10, 5, clock=lambda: now[0])  # type: ignore[arg-type]
    alice = Credentials(ACCESS_PAT, "alice-token")
    results = await asyncio.gather(*(authorizer.authorize("ws", None, alice) for _ in range(5)))
    assert hub.calls == 1 and all(r.actual_state == "Running" for r in results)
    hub.state = "Stopped"
    assert (await authorizer.authorize("ws", None, alice)).actual_state == "Running"  # cached
    assert authorizer.invalidate(["other"]) == 0
    assert authorizer.invalidate(["ws"]) == 1
    assert (await authorizer.authorize("ws", None, alice)).actual_state == "Stopped"
    now[0] = 11.0
    await authorizer.authorize("ws", None, alice)
    assert hub.calls == 3


async def test_an_answer_in_flight_during_a_change_is_not_kept() -> None:
    hub = FakeHub()
    hub.gate = asyncio.Event()
    authorizer = WorkspaceAuthorizer(hub, 10, 5)  # type: ignore[arg-type]
    alice = Credentials(ACCESS_PAT, "alice-token")
    first = asyncio.ensure_future(authorizer.authorize("ws", None, alice))
    await asyncio.sleep(0)
    authorizer.invalidate(["ws"])
    hub.gate.set()
    await first
    hub.state = "Stopped"
    assert (await authorizer.authorize("ws", None, alice)).actual_state == "Stopped"
    assert hub.calls == 2


@pytest.mark.parametrize(("hub_code", "code"), [(401, 401), (403, 403), (404, 403), (500, 502)])
async def test_hub_refusals_map_to_401_403_and_failures_to_502(hub_code: int, code: int) -> None:
    hub = FakeHub()
    hub.refuse = hub_code
    authorizer = WorkspaceAuthorizer(hub, 10, 5)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(AccessRefused) as caught:
            await authorizer.authorize("ws", None, Credentials(ACCESS_PAT, "t"))
        assert caught.value.code == code
        assert "t" not in caught.value.message.split()
    assert hub.calls == (1 if code in (401, 403) else 2)  # refusals cached, failures not


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/index.html?a=1", "/index.html?a=1"),
        ("/-/workspaces/ws/60001/", "/-/workspaces/ws/60001/"),
        ("//evil.example/", "/"),
        ("/\\evil.example/", "/"),
        ("/a\\b", "/"),
        ("https://evil.example/", "/"),
        ("/a\r\nSet-Cookie: x", "/"),
    ],
)
def test_after_sign_in_only_a_plain_local_path_is_followed(target: str, expected: str) -> None:
    assert _local(target) == expected


# ---- the sign-in's cookies -------------------------------------------------------------------------------


def _cookie(response: Any, name: str) -> Any:
    return response.cookies[name]


def test_the_sign_in_cookies_are_scoped_httponly_and_secure_over_https() -> None:
    sign_in = SignIn(SECRET, "https://hub.example.com/-/workspaces/authorize")
    https = AddressBook(["ws.example.com"], "https", "https://kas.example.com")
    for host, target, domain, path in (
        ("60001-a.ws.example.com", "/x?y=1", "ws.example.com", "/"),
        ("kas.example.com", "/-/workspaces/a/60001/x?y=1", "", "/-/workspaces/"),
    ):
        address = https.parse([host], target)
        started = sign_in.start(address, stale_cookie=False)
        assert started.status == 302
        location = started.headers["Location"]
        assert location.startswith("https://hub.example.com/-/workspaces/authorize?request=")
        state = _cookie(started, STATE_COOKIE)
        assert state["secure"] and state["httponly"] and state["samesite"] == "Lax" and not state["domain"]
        assert state["path"] == "/-/workspaces/-/callback"
        asked = AuthorizeRequest.read(location.split("request=", 1)[1], SECRET)
        assert asked.callback_url == f"https://{host}/-/workspaces/-/callback"
        assert asked.return_to == target
        assert nonce_matches(state.value, asked.nonce_sha256)

        ends = int(time.time()) + 3600
        code = SignInCode(7, 42, ends, asked).mint(SECRET)
        callback = https.parse([host], f"/-/workspaces/-/callback?code={code}")
        request = make_mocked_request(
            "GET",
            f"/-/workspaces/-/callback?code={code}",
            headers={"Host": host, "Cookie": f"{STATE_COOKIE}={state.value}"},
        )
        finished = sign_in.finish(request, callback)
        assert (finished.status, finished.headers["Location"]) == (302, target)
        session = _cookie(finished, SESSION_COOKIE)
        assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"
        assert (session["domain"], session["path"]) == (domain, path)
        assert 3500 < int(session["max-age"]) <= 3600
        assert WorkspaceSession.read(session.value, SECRET) == WorkspaceSession(7, 42, ends)

        # The same code at another workspace's callback, or without the state cookie: refused.
        other = https.parse(["60001-b.ws.example.com"], f"/-/workspaces/-/callback?code={code}")
        stolen = make_mocked_request("GET", f"/-/workspaces/-/callback?code={code}", headers={"Host": host})
        for req, where in ((request, other), (stolen, callback)):
            assert sign_in.finish(req, where).status == 400


# ---- configuration ---------------------------------------------------------------------------------------

_BASE = {
    "gitlab": {"authentication_secret_file": "/s"},
    "api": {"listen": {"authentication_secret_file": "/s"}},
    "private_api": {"listen": {"authentication_secret_file": "/p"}},
}


def test_the_workspaces_section_defaults_and_validation(tmp_path: Any) -> None:
    assert KasConfig.model_validate(_BASE).workspaces is None
    section = KasConfig.model_validate({**_BASE, "workspaces": {"dns_zones": ["WS.Example.com."]}}).workspaces
    assert section is not None
    assert (section.listen.address, section.dns_zones, section.path_url) == ("0.0.0.0:8156", ["ws.example.com"], None)
    assert (section.authorization_cache_ttl, section.agent_timeout, section.response_header_timeout) == (10, 10, 120)
    for bad, problem in (
        ({}, "set dns_zones"),
        ({"dns_zones": ["example"]}, "at least two labels"),
        ({"dns_zones": ["a..b"]}, "DNS name"),
        ({"dns_zones": ["*.ws.example.com"]}, "DNS name"),
        ({"path_url": "https://kas.example.com/prefix"}, "origin"),
        ({"path_url": "ftp://kas.example.com"}, "origin"),
    ):
        path = tmp_path / "kas.yaml"
        path.write_text(yaml.safe_dump({**_BASE, "workspaces": bad}))
        with pytest.raises(ConfigError, match=problem):
            load_config(path)
