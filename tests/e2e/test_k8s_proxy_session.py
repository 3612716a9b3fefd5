"""A browser signed in to the real hub reaches the real cluster through real kas and agentk (kas.md §4.5).

The browser (aiohttp with a cookie jar) signs in through the hub's form, gets ``_gitlab_session`` and
``_gitlab_kas``, and calls kas' Kubernetes API proxy with the ``_gitlab_kas`` cookie, ``Gitlab-Agent-Id`` and
``X-Csrf-Token``; kas asks the hub's ``authorize_proxy_user`` with ``access_type: session_cookie``. kas' answer
caches are off so that a sign-out shows at once.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.system import KasProc, System
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]

NO_CACHE = {"agent": {"kubernetes_api": {"allowed_agent_cache_ttl": "0s", "allowed_agent_cache_error_ttl": "0s"}}}


def register_agent(hub: RealHub, access_as: str = "agent") -> tuple[int, str, str]:
    """A project ``root/clusters`` with agent ``browser``, ``user_access`` (``access_as``: ``agent`` or
    ``user``) for the project, and developer ``alice`` (a ``k8s_proxy`` token); returns (agent id, agent token,
    alice's token)."""
    admin = hub.api()
    project = admin.post("/projects", json={"name": "clusters"}).json()
    agents = f"/projects/{project['id']}/cluster_agents"
    agent = admin.post(agents, json={"name": "browser"}).json()
    agent_token = admin.post(f"{agents}/{agent['id']}/tokens", json={"name": "agentk"}).json()["token"]
    configuration = (
        f"user_access:\n  access_as:\n    {access_as}: {{}}\n  projects:\n  - id: {project['path_with_namespace']}\n"
    )
    response = admin.put(f"{agents}/{agent['id']}/configuration", content=configuration.encode())
    assert response.status_code == 200, response.text
    alice_id, alice_token = hub.user("alice", ("k8s_proxy",))
    member = admin.post(f"/projects/{project['id']}/members", json={"user_id": alice_id, "access_level": 30})
    assert member.status_code == 201, member.text
    return int(agent["id"]), agent_token, alice_token


async def wait_for_tunnel(system: System, kas: KasProc, agent_id: int, limit_s: float = 60) -> None:
    """Poll Redis until agentk's tunnel to ``kas`` is registered (a bound, not a measurement)."""
    deadline = time.monotonic() + limit_s
    while kas.private_url not in await system.tunnel_urls(agent_id):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit_s}s waiting for agentk's tunnel")
        await asyncio.sleep(0.2)


async def sign_in(browser: aiohttp.ClientSession, hub: RealHub, login: str, token: str) -> str:
    """Fill in the hub's sign-in form; returns the CSRF token shown on the page."""
    async with browser.get(f"{hub.url}/users/sign_in") as form:
        assert form.status == 200 and 'name="token"' in await form.text()
    async with browser.post(f"{hub.url}/users/sign_in", data={"login": login, "token": token}) as page:
        html = await page.text()
        assert page.status == 200, html
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', html)
    assert found is not None, html
    async with browser.get(f"{hub.url}/users/session") as session:
        assert (await session.json())["csrf_token"] == found.group(1)
    return found.group(1)


async def proxy_get(
    browser: aiohttp.ClientSession, kas: KasProc, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any], str]:
    async with browser.get(kas.k8s_proxy_url + path, headers=headers) as response:
        return response.status, await response.json(content_type=None), response.headers.get("Gitlab-Unauthorized", "")


async def test_a_signed_in_browser_lists_namespaces_through_kas(
    hub_launcher: HubLauncher,
    k8s_cluster: ClusterInfo,
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    tmp_path: Path,
) -> None:
    hub = hub_launcher.launch()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, k8s_cluster.kubeconfig, redis_server, proxy_tls)  # type: ignore[arg-type]
    try:
        kas = system.kas(**NO_CACHE)
        agent_id, agent_token, alice_token = register_agent(hub)
        system.agentk(agent_token, kas)
        await wait_for_tunnel(system, kas, agent_id)

        assert kas.k8s_proxy_ca is not None
        tls = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
        jar = aiohttp.CookieJar(unsafe=True)  # the hub and kas are both on 127.0.0.1
        async with aiohttp.ClientSession(cookie_jar=jar, connector=aiohttp.TCPConnector(ssl=tls)) as browser:
            csrf = await sign_in(browser, hub, "alice", alice_token)
            assert {cookie.key for cookie in jar} == {"_gitlab_session", "_gitlab_kas"}
            agent = {"Gitlab-Agent-Id": str(agent_id)}

            status, body, _ = await proxy_get(browser, kas, "api/v1/namespaces", {**agent, "X-Csrf-Token": csrf})
            assert status == 200, body
            assert body["kind"] == "NamespaceList"
            assert "default" in {item["metadata"]["name"] for item in body["items"]}
            assert f"may use agent {agent_id}'s cluster as agent (session_cookie)" in hub.log.text

            for headers in (agent, {**agent, "X-Csrf-Token": "not-the-token"}):
                status, body, unauthorized = await proxy_get(browser, kas, "api/v1/namespaces", headers)
                assert (status, body["kind"], body["code"], unauthorized) == (401, "Status", 401, "true"), body

            kas_cookie = next(cookie.value for cookie in jar if cookie.key == "_gitlab_kas")
            async with browser.post(f"{hub.url}/users/sign_out", headers={"X-Csrf-Token": csrf}) as out:
                assert out.status == 200
            assert not [cookie for cookie in jar if cookie.value], "sign-out cleared the cookies"
            replayed = {**agent, "X-Csrf-Token": csrf, "Cookie": f"_gitlab_kas={kas_cookie}"}
            status, body, unauthorized = await proxy_get(browser, kas, "api/v1/namespaces", replayed)
            assert (status, unauthorized) == (401, "true"), "the signed-out session's cookie no longer works"
    finally:
        system.stop_all()
