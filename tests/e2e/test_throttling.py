"""Failed sign-ins and unknown tokens are throttled per client address, on kas' proxy and on the hub, and the
throttling shows in metrics (issue 9 item 4). Real hub, kas and Redis."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import KasProc, System
from tests.hub.helpers import post_sign_in
from tether_devenv import pki
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.redis]

LIMIT = 5


def within_one_window(room_s: float = 15.0) -> None:
    """Wait, if needed, until a whole run of attempts fits in one minute window of the hub's limiter.

    Its sliding-window counter weighs the previous minute's count by the part of it still in view and rounds
    down, so a run that crosses a minute boundary can see one attempt past the limit let through.
    """
    left = 60.0 - time.time() % 60.0
    if left < room_s:
        time.sleep(left + 0.5)


async def test_kas_proxy_throttles_refused_credentials_per_address(
    hub_launcher: HubLauncher,
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    tmp_path: Path,
) -> None:
    hub = hub_launcher.launch()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, None, redis_server, proxy_tls)  # type: ignore[arg-type]
    throttle: dict[str, Any] = {
        "agent": {"kubernetes_api": {"failed_auth_per_source_per_minute": LIMIT}},
        "routing": {"tunnel_find_timeout": "1s"},  # the good tokens' agent is not connected: 504 after 1 s
    }
    # Agent 9101 is never connected: a request that passes authorization waits 1 s for it, then gets 504.
    hub.grant_proxy_access("glpat-known-good", "known", 9101, 9101)
    hub.grant_proxy_access("glpat-fresh-good", "fresh", 9101, 9101)
    try:
        kas1, kas2 = system.kas(**throttle), system.kas(**throttle)
        assert kas1.k8s_proxy_ca is not None
        tls = ssl.create_default_context(cafile=str(kas1.k8s_proxy_ca))
        statuses = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as http:

            async def status_with(kas: KasProc, token: str) -> int:
                headers = {"Authorization": f"Bearer pat:9101:{token}"}
                async with http.get(kas.k8s_proxy_url + "api/v1/namespaces", headers=headers) as response:
                    return response.status

            assert await status_with(kas1, "glpat-known-good") == 504, "accepted, then no agent to reach"
            for index in range(LIMIT + 2):
                kas = (kas1, kas2)[index % 2]  # the count is shared through Redis
                # A made-up client address per attempt changes nothing: kas believes only the peer (issue 27).
                headers = {
                    "Authorization": f"Bearer pat:1:glpat-guess-{index}",
                    "X-Forwarded-For": f"203.0.113.{index}",
                    "Forwarded": f"for=203.0.113.{index}",
                    "X-Real-IP": f"203.0.113.{index}",
                }
                async with http.get(kas.k8s_proxy_url + "api/v1/namespaces", headers=headers) as response:
                    statuses.append(response.status)
                    body = await response.json()
                    if response.status == 429:
                        assert response.headers["Retry-After"] == "60"
                        assert body["kind"] == "Status" and body["reason"] == "TooManyRequests", body
            # Credentials the hub accepted before are not a guess: the throttle does not hold them up (issue 28:
            # no Redis round trip for them). Credentials not yet accepted wait, however good.
            assert await status_with(kas1, "glpat-known-good") == 504
            assert await status_with(kas1, "glpat-fresh-good") == 429
        assert statuses == [401] * LIMIT + [429, 429], statuses
        authorize_calls = hub.log.text.count("/internal/kubernetes/authorize_proxy_user")
        assert 0 < authorize_calls <= LIMIT + 1, "throttled requests cost no hub call"
        assert any('tether_rate_limited_total{limit="proxy_auth_failures"}' in k.metrics() for k in (kas1, kas2))
    finally:
        system.stop_all()


def test_hub_throttles_failed_sign_ins_and_unknown_tokens_per_address(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch({"security.failed_auth_per_source_per_minute": LIMIT})
    _, token = hub.user("bob")
    within_one_window()
    statuses = [post_sign_in(hub, "bob", f"glpat-wrong-{i}").status_code for i in range(3)]
    statuses += [hub.api(f"glpat-unknown-{i}").get("/user").status_code for i in range(LIMIT - 3 + 2)]
    assert statuses == [401] * LIMIT + [429, 429], statuses
    refused = post_sign_in(hub, "bob", token)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    assert hub.api(token).get("/user").status_code == 429, "a good token from a throttled address waits too"
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        metrics = client.get("/-/metrics").text
    assert 'tether_rate_limited_total{limit="hub_auth_failures"}' in metrics


def test_hub_ignores_forwarded_for_from_peers_that_are_not_configured_proxies(hub_launcher: HubLauncher) -> None:
    """Issue 27 item 8: from 127.0.0.1 a made-up ``X-Forwarded-For`` per attempt escaped the throttle."""
    hub = hub_launcher.launch({"security.failed_auth_per_source_per_minute": LIMIT})
    hub.user("bob")
    within_one_window()
    statuses = [
        post_sign_in(hub, "bob", f"glpat-wrong-{i}", {"X-Forwarded-For": f"203.0.113.{i}"}).status_code
        for i in range(LIMIT + 2)
    ]
    assert statuses == [401] * LIMIT + [429, 429], statuses


def test_hub_believes_forwarded_for_from_a_configured_proxy(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch(
        {"security.failed_auth_per_source_per_minute": LIMIT, "security.trusted_proxies": ["127.0.0.0/8"]}
    )
    hub.user("bob")
    within_one_window()

    def attempt(forwarded_for: str) -> int:
        return post_sign_in(hub, "bob", "glpat-wrong", {"X-Forwarded-For": forwarded_for}).status_code

    # The proxy appends the address it saw: what the client wrote before it does not count.
    statuses = [attempt(f"198.51.100.{i}, 203.0.113.7") for i in range(LIMIT + 1)]
    assert statuses == [401] * LIMIT + [429], statuses
    assert attempt("203.0.113.8") == 401, "another client behind the proxy has its own count"
