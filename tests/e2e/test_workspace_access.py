"""Reaching a workspace through real kas and agentk, on the real cluster (issue 13 acceptance).

The workspace's editor is a real HTTP and WebSocket server (``tests.support.workspace_editor``) in a network
namespace of its own; the workspace's Service has no selector and an EndpointSlice pointing at that server, so
agentk resolves the slice and dials it as it would a pod. The hub is real; its workspaces are seeded as
reconciliation leaves them. Clients are aiohttp sessions with a cookie jar; the zone's hosts resolve to kas.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yarl

from tests.e2e.test_k8s_proxy_session import wait_for_tunnel
from tests.fixtures.bulk_endpoint import rss_mib
from tests.fixtures.hub import HubLauncher
from tests.fixtures.k8s import Kubectl
from tests.fixtures.netns import NetnsServer
from tests.fixtures.secrets_in_logs import remember_secret
from tests.fixtures.system import AgentkProc, KasProc, System
from tests.hub.workspace_helpers import RD_CONFIG, UPDATE, deployment, graphql, info, reconcile, workspace_setup
from tests.hub.workspace_helpers import create as create_workspace
from tests.support.polling import poll, poll_sync
from tests.support.workspace_access import (
    DEVFILE,
    ZONE,
    body_of,
    browser,
    seed_workspace,
    service_manifest,
    unique,
    workspaces_section,
)
from tests.support.workspace_editor import pattern
from tether_devenv.cluster import ClusterInfo
from tether_devenv.process import free_port
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.k8s, pytest.mark.redis]

MIB = 1024 * 1024


@dataclass
class Env:
    system: System
    kas: KasProc
    port: int
    agent_id: int
    project_id: int
    namespace: str
    editor: NetnsServer
    owner: tuple[int, str]
    other: tuple[int, str]
    name: str
    workspace_id: int
    kubectl: Kubectl
    agentk: AgentkProc | None = None

    def host_url(self, path: str = "/", name: str | None = None, port: int = 60001, kas_port: int | None = None) -> str:
        return f"http://{port}-{name or self.name}.{ZONE}:{kas_port or self.port}{path}"

    def path_url(self, path: str = "/", name: str | None = None, port: int = 60001, kas_port: int | None = None) -> str:
        return f"http://127.0.0.1:{kas_port or self.port}/-/workspaces/{name or self.name}/{port}{path}"

    @property
    def owner_auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.owner[1]}"}

    def serve(self, name: str, workspace_id: int) -> None:
        """The workspace's Service and EndpointSlice, pointing at the editor."""
        manifest = service_manifest(
            name=name,
            namespace=self.namespace,
            agent_id=self.agent_id,
            workspace_id=workspace_id,
            address=self.editor.address,
            port=self.editor.port,
        )
        self.kubectl.run("apply", "-f", "-", input_text=manifest)

    def seed(
        self,
        name: str,
        actual: str = "Running",
        agent_id: int | None = None,
        message: str = "",
        desired: str = "Running",
    ) -> int:
        return seed_workspace(
            self.system.hub,
            agent_id=agent_id or self.agent_id,
            user_id=self.owner[0],
            project_id=self.project_id,
            name=name,
            namespace=self.namespace,
            actual=actual,
            desired=desired,
            message=message,
        )

    async def editor_count(self) -> int:
        async with aiohttp.ClientSession() as direct, direct.get(f"{self.editor.url}/count") as response:
            return int((await response.json())["count"])


def kas_with_workspaces(system: System, **section: Any) -> tuple[KasProc, int]:
    port = free_port()
    return system.kas(workspaces=workspaces_section(port, **section)), port


@pytest.fixture
def env(
    system: System,
    k8s_cluster: ClusterInfo,
    kubectl: Kubectl,
    k8s_namespace: str,
    netns_editor: NetnsServer,
) -> Iterator[Env]:
    hub = system.hub
    agent_id, project_id = random.randrange(10**6, 10**9), random.randrange(10**6, 10**9)
    agent_token = f"agent-{unique('token')}-{random.getrandbits(64):x}"
    hub.add_agent(agent_token, agent_id, project_id)
    owner = hub.user(unique("owner"), ("read_api",))
    other = hub.user(unique("other"), ("api",))
    name = unique("ws")
    kas, port = kas_with_workspaces(system)
    workspace_id = seed_workspace(
        hub,
        agent_id=agent_id,
        user_id=owner[0],
        project_id=project_id,
        name=name,
        namespace=k8s_namespace,
    )
    env = Env(
        system, kas, port, agent_id, project_id, k8s_namespace, netns_editor, owner, other, name, workspace_id, kubectl
    )
    env.serve(name, workspace_id)
    env.agentk = system.agentk(agent_token, kas)
    yield env


async def wait_until_connected(env: Env) -> None:
    """The agent's tunnel is on kas and agentk has its configuration (its readiness), which serving needs."""
    await wait_for_tunnel(env.system, env.kas, env.agent_id)
    agentk = env.agentk
    assert agentk is not None

    async def ready() -> bool:
        return (await asyncio.to_thread(agentk.readiness))[0] == 200

    await poll(ready, "agentk ready (configuration received)", limit=30)


@pytest.fixture
async def connected(env: Env) -> AsyncIterator[Env]:
    await wait_until_connected(env)
    yield env


# ---- the owner, with a personal access token --------------------------------------------------------------


async def test_the_owner_loads_the_page_in_both_forms_without_passing_credentials(connected: Env) -> None:
    env = connected
    async with browser() as client:
        for url in (env.host_url("/"), env.path_url("/")):
            async with client.get(url, headers={**env.owner_auth, "Accept": "text/html"}) as response:
                assert response.status == 200, await response.text()
                assert "Workspace editor" in await response.text()
        cookies = {"Cookie": "editor-theme=dark; _tether_workspaces=not-for-the-workspace"}
        exact = yarl.URL(env.host_url("/headers?x=%2F1&y=2"), encoded=True)  # sent as written
        async with client.get(exact, headers={**env.owner_auth, **cookies}) as response:
            seen = await response.json()
        headers = {k.lower(): v for k, v in seen["headers"]}
        assert seen["path"] == "/headers?x=%2F1&y=2"
        assert "authorization" not in headers
        assert headers["cookie"] == "editor-theme=dark"
        assert headers["host"] == f"60001-{env.name}.{ZONE}:{env.port}"
        assert headers["x-forwarded-proto"] == "http" and headers["x-forwarded-host"] == headers["host"]
        assert env.owner[1] not in repr(seen)

        async with client.get(env.path_url("/headers"), headers=env.owner_auth) as response:
            seen = await response.json()
        assert seen["path"] == "/headers"
        assert dict((k.lower(), v) for k, v in seen["headers"])["x-forwarded-prefix"] == (
            f"/-/workspaces/{env.name}/60001"
        )
        # The path form puts its prefix back on the workspace's own redirects.
        async with client.get(env.path_url("/redirect"), headers=env.owner_auth, allow_redirects=False) as response:
            assert response.status == 302
            assert response.headers["Location"] == f"/-/workspaces/{env.name}/60001/landing"
        # A path-form address without its trailing slash is redirected, keeping the query.
        bare = f"http://127.0.0.1:{env.port}/-/workspaces/{env.name}/60001?a=1"
        async with client.get(bare, allow_redirects=False) as response:
            assert (response.status, response.headers["Location"]) == (308, f"/-/workspaces/{env.name}/60001/?a=1")

        # The workspace cannot set kas' session cookie; its own cookies pass.
        async with client.get(env.host_url("/set-cookie"), headers=env.owner_auth) as response:
            assert response.status == 200
            assert response.headers.getall("Set-Cookie") == ["editor-theme=dark; Path=/"]  # no _gitlab_session


async def test_no_credential_of_tether_reaches_the_workspace(connected: Env) -> None:
    """Issue 27 item 2: a browser signed in at the hub sends the hub's cookies wherever the workspaces share its
    host (``tether up``: cookies ignore ports) or its cookie domain; the editor echoes all it receives."""
    env = connected
    hub = env.system.hub
    login = hub.api().get(f"/users/{env.owner[0]}").json()["username"]
    sign_in_token = hub.token_for(env.owner[0], ("api",))
    async with browser() as client:
        async with client.post(f"{hub.url}/users/sign_in", data={"login": login, "token": sign_in_token}) as response:
            assert response.status == 200
        async with client.get(f"{hub.url}/users/session") as response:
            csrf = (await response.json())["csrf_token"]
        jar = {c.key: c.value for c in client.cookie_jar}
        secrets = [jar["_gitlab_session"], csrf, env.owner[1], sign_in_token]
        # tether up's layout: the path form on the hub's host, another port; the browser sends the session along.
        sent = client.cookie_jar.filter_cookies(yarl.URL(env.path_url("/headers")))
        assert "_gitlab_session" in sent
        # Every credential header a client could add, too: none passes.
        extra = {
            "Private-Token": env.owner[1],
            "Job-Token": env.owner[1],
            "X-Csrf-Token": csrf,
            "Gitlab-Csrf-Token": csrf,
            "X-Gitlab-Token": env.owner[1],
            "Proxy-Authorization": f"Bearer {env.owner[1]}",
            "Cookie": "editor-theme=dark",
            "X-XSRFToken": "the-editor-own",
        }
        echoes = []
        async with client.get(env.path_url("/headers"), headers={**env.owner_auth, **extra}) as response:
            assert response.status == 200, await response.text()
            echoes.append(await response.json())
            assert "X-Frame-Options" not in response.headers, "the workspace's own answer: kas adds no policy"
        # A shared cookie domain (sessions.kas_cookie_domain covering the zone): the same cookies at a zone host.
        hub_cookies = (
            f"_gitlab_session={jar['_gitlab_session']}; _gitlab_kas={jar['_gitlab_session']}; "
            f"__Host-_gitlab_session={jar['_gitlab_session']}; editor-theme=dark"
        )
        async with client.get(env.host_url("/headers"), headers={**env.owner_auth, "Cookie": hub_cookies}) as response:
            assert response.status == 200, await response.text()
            echoes.append(await response.json())
    for seen in echoes:
        headers = {k.lower(): v for k, v in seen["headers"]}
        for secret in secrets:
            assert secret not in repr(seen)
        assert "_gitlab" not in headers.get("cookie", "") and "_tether" not in headers.get("cookie", "")
        assert "editor-theme=dark" in headers["cookie"]
        for name in ("authorization", "proxy-authorization", "private-token", "job-token", "x-csrf-token"):
            assert name not in headers, name
    assert {k.lower(): v for k, v in echoes[0]["headers"]}["x-xsrftoken"] == "the-editor-own"


async def test_the_owner_uploads_and_downloads_50_mib(connected: Env) -> None:
    env = connected
    size_mib = 50
    payload = pattern(size_mib)

    async def body() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), MIB):
            yield payload[start : start + MIB]

    async with browser() as client:
        async with client.post(env.host_url("/upload"), data=body(), headers=env.owner_auth) as response:
            assert response.status == 200, await response.text()
            assert await response.json() == {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        digest, size = hashlib.sha256(), 0
        async with client.get(env.path_url(f"/download?mb={size_mib}"), headers=env.owner_auth) as response:
            assert response.status == 200
            async for chunk in response.content.iter_any():
                digest.update(chunk)
                size += len(chunk)
        assert (size, digest.hexdigest()) == (len(payload), hashlib.sha256(payload).hexdigest())


async def test_the_owner_exchanges_websocket_messages_both_ways(connected: Env) -> None:
    env = connected
    async with browser() as client:
        for url in (env.host_url("/ws"), env.path_url("/ws")):
            async with client.ws_connect(url, headers=env.owner_auth) as ws:
                assert await ws.receive_str(timeout=10) == "hello"  # the workspace speaks first
                for i in range(20):
                    await ws.send_str(f"line {i}")
                    assert await ws.receive_str(timeout=10) == f"echo: line {i}"
                blob = bytes(range(256)) * 1024
                await ws.send_bytes(blob)
                assert await ws.receive_bytes(timeout=10) == blob


# ---- everyone else, and the states --------------------------------------------------------------------


async def test_others_get_403_without_learning_whether_the_workspace_exists(connected: Env) -> None:
    env = connected
    async with browser() as client:
        other = {"Authorization": f"Bearer {env.other[1]}"}
        answers = []
        for name in (env.name, unique("no-such-ws")):
            async with client.get(env.host_url("/", name=name), headers=other) as response:
                answers.append((response.status, (await body_of(response))["error"]))
            async with client.get(env.path_url("/", name=name), headers=other) as response:
                answers.append((response.status, (await body_of(response))["error"]))
        assert answers == [(403, "Forbidden")] * 4
        # The owner asking for a name nobody has gets the same answer.
        async with client.get(env.host_url("/", name=unique("no-such-ws")), headers=env.owner_auth) as response:
            assert response.status == 403

        # No token: 401 for tools, the sign-in redirect for a browser page load.
        async with client.get(env.host_url("/")) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert "Authorization: Bearer" in (await body_of(response))["message"]
        async with client.get(env.host_url("/"), headers={"Accept": "text/html"}, allow_redirects=False) as response:
            assert response.status == 302
            assert response.headers["Location"].startswith(f"{env.system.hub.url}/-/workspaces/authorize?request=")
        # A token of the owner without api/read_api, a wrong token, a malformed header: 401.
        k8s_only = env.system.hub.token_for(env.owner[0], ("k8s_proxy",))
        for value in (f"Bearer {k8s_only}", "Bearer not-a-token-at-all", "Basic b3duZXI6cHc="):
            async with client.get(env.host_url("/"), headers={"Authorization": value}) as response:
                assert response.status == 401, value
        # A port the workspace does not expose: 404 for its owner (403 for the others, as above).
        async with client.get(env.host_url("/", port=60002), headers=env.owner_auth) as response:
            assert response.status == 404
            assert "does not expose port 60002" in (await body_of(response))["message"]
        async with client.get(env.host_url("/", port=60002), headers=other) as response:
            assert response.status == 403
        # A port the devfile declares that the Service does not: agentk says so, and kas answers 502.
        async with client.get(env.host_url("/", port=3000), headers=env.owner_auth) as response:
            assert response.status == 502
            assert "does not expose port 3000" in (await body_of(response))["message"]


async def test_a_workspace_that_is_not_running_answers_with_its_state(connected: Env) -> None:
    env = connected
    before = await env.editor_count()
    async with browser() as client:
        for actual, desired, code, kind in (
            ("Stopped", "Stopped", 503, "stopped"),
            # Just started: agentk has not reported it yet, so the page asks to retry instead of to start it.
            ("Stopped", "Running", 503, "starting"),
            ("Starting", "Running", 503, "starting"),
            ("Failed", "Running", 503, "failed"),
            ("Terminated", "Terminated", 410, "terminated"),
        ):
            name = unique(kind)
            failure = "ImagePullBackOff: image not found" if kind == "failed" else ""
            env.seed(name, actual, message=failure, desired=desired)
            async with client.get(env.host_url("/", name=name), headers=env.owner_auth) as response:
                assert response.status == code
                answer = await response.json()
            assert answer["error"] == f"workspace {kind}"
            assert answer["workspace"]["actual_state"] == actual
            assert answer["console_url"] == f"{env.system.hub.url}/workspaces"
            if kind == "starting":
                assert response.headers["Retry-After"] == "5"
            if kind in ("stopped", "failed"):
                assert "workspaceUpdate" in answer["start_mutation"]
            headers = {**env.owner_auth, "Accept": "text/html"}
            async with client.get(env.path_url("/", name=name), headers=headers) as response:
                assert response.status == code
                page = await response.text()
            assert f"Workspace {name}" in page and 'href="' in page
            if kind == "failed":
                assert "ImagePullBackOff: image not found" in page
    assert await env.editor_count() == before  # none of them reached the cluster


async def test_a_workspace_of_an_agent_that_is_not_connected_gives_502_at_once(connected: Env) -> None:
    env = connected
    lonely_agent = random.randrange(10**6, 10**9)
    env.system.hub.add_agent(f"lonely-{unique('t')}-{random.getrandbits(64):x}", lonely_agent, env.project_id)
    name = unique("lonely")
    env.seed(name, "Running", agent_id=lonely_agent)
    async with browser() as client:
        started = time.monotonic()
        async with client.get(env.host_url("/", name=name), headers=env.owner_auth) as response:
            assert response.status == 502
            answer = await body_of(response)
        assert time.monotonic() - started < 10  # far below agent_timeout + the client's patience
        assert answer["error"] == "Agent not connected"
        assert f"agent {lonely_agent}" in answer["message"] and "not connected" in answer["message"]


async def test_agentk_dials_only_workspace_services_of_its_own_agent(connected: Env) -> None:
    env = connected
    name = unique("foreign")
    workspace_id = env.seed(name)
    manifest = service_manifest(
        name=name,
        namespace=env.namespace,
        agent_id=env.agent_id + 1,  # labelled for another agent
        workspace_id=workspace_id,
        address=env.editor.address,
        port=env.editor.port,
    )
    env.kubectl.run("apply", "-f", "-", input_text=manifest)
    before = await env.editor_count()
    async with browser() as client, client.get(env.host_url("/", name=name), headers=env.owner_auth) as response:
        assert response.status == 502
        assert "is not a workspace Service of this agent" in (await body_of(response))["message"]
    assert await env.editor_count() == before


# ---- browsers ------------------------------------------------------------------------------------------


async def test_a_browser_signs_in_at_the_hub_and_comes_back(
    system: System, env: Env, k8s_cluster: ClusterInfo, tmp_path: Path
) -> None:
    # A kas without answer caches: a sign-out at the hub shows at once.
    _, port = kas_with_workspaces(system, authorization_cache_ttl="0s", authorization_cache_error_ttl="0s")
    await wait_until_connected(env)
    hub = system.hub
    login = hub.api().get(f"/users/{env.owner[0]}").json()["username"]
    sign_in_token = hub.token_for(env.owner[0], ("api",))
    second = unique("second")
    env.serve(second, env.seed(second, "Running"))
    async with browser() as client:
        page = {"Accept": "text/html"}
        start = env.host_url("/?folder=%2Fprojects%2Fdemo", kas_port=port)
        async with client.get(start, headers=page) as response:
            # kas -> hub authorize -> hub sign-in form (the redirects followed by the client)
            assert response.status == 200
            assert str(response.url).startswith(f"{hub.url}/users/sign_in?redirect_to=")
            form = await response.text()
        redirect_to = re.search(r'name="redirect_to" value="([^"]+)"', form)
        assert redirect_to is not None
        target = redirect_to.group(1).replace("&amp;", "&")
        async with client.post(
            f"{hub.url}/users/sign_in",
            data={"login": login, "token": sign_in_token, "redirect_to": target},
            headers=page,
        ) as response:
            # hub -> kas callback (code) -> the page first asked for
            assert response.status == 200, await response.text()
            assert response.url == yarl.URL(start)
            assert "Workspace editor" in await response.text()
            hops = [str(h.url) for h in response.history]
        assert any("/-/workspaces/-/callback?code=" in hop for hop in hops), hops
        for hop in hops:
            if "code=" in hop:
                remember_secret(hop.split("code=", 1)[1])
        session = [c for c in client.cookie_jar if c.key == "_tether_workspaces"]
        assert len(session) == 1
        remember_secret(session[0].value)
        assert session[0]["domain"] == ZONE and session[0]["httponly"] and session[0]["path"] == "/"
        assert not [c for c in client.cookie_jar if c.key == "_tether_workspaces_state" and c.value]

        # One sign-in serves every workspace of the zone, WebSockets included.
        async with client.get(env.host_url("/", name=second, kas_port=port), headers=page) as response:
            assert response.status == 200 and not response.history
        async with client.ws_connect(env.host_url("/ws", kas_port=port)) as ws:
            assert await ws.receive_str(timeout=10) == "hello"
        # Another workspace's page may not use the cookie: no WebSocket, no POST in the user's name.
        elsewhere = {"Origin": f"http://60001-{second}.{ZONE}:{port}"}
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(env.host_url("/ws", kas_port=port), headers=elsewhere)
        assert refused.value.status == 403
        async with client.post(env.host_url("/upload", kas_port=port), data=b"x", headers=elsewhere) as response:
            assert response.status == 403
        own = {"Origin": f"http://60001-{env.name}.{ZONE}:{port}"}
        async with client.post(env.host_url("/upload", kas_port=port), data=b"x", headers=own) as response:
            assert response.status == 200
        # The workspace never sees the session cookie.
        async with client.get(env.host_url("/headers", kas_port=port)) as response:
            seen = {k.lower(): v for k, v in (await response.json())["headers"]}
        assert "_tether_workspaces" not in seen.get("cookie", "")

        # Signing out of the hub ends the workspace session.
        csrf = (await (await client.get(f"{hub.url}/users/session")).json())["csrf_token"]
        async with client.post(f"{hub.url}/users/sign_out", headers={"X-Csrf-Token": csrf}) as response:
            assert response.status == 200
        async with client.get(env.host_url("/", kas_port=port), headers=page, allow_redirects=False) as response:
            assert response.status == 302
            assert response.headers["Location"].startswith(f"{hub.url}/-/workspaces/authorize?")
        async with client.get(env.host_url("/", kas_port=port)) as response:
            assert response.status == 401

        # A code replayed without the state cookie of the browser that asked is refused.
        replay = next(hop for hop in hops if "code=" in hop)
        async with browser() as stranger, stranger.get(replay, headers=page, allow_redirects=False) as response:
            assert response.status == 400
            assert "another browser" in await response.text()


async def test_over_tls_the_workspace_is_served_and_the_cookies_are_secure(connected: Env, tmp_path: Path) -> None:
    env = connected
    tls = env.system.proxy_tls
    assert tls is not None
    port = free_port()
    section = workspaces_section(port)
    section["listen"].update({"certificate_file": str(tls.serving_cert), "key_file": str(tls.serving_key)})
    section["path_url"] = f"https://127.0.0.1:{port}"
    env.system.kas(workspaces=section)
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    url = f"https://127.0.0.1:{port}/-/workspaces/{env.name}/60001/"
    async with browser(connector_ssl=context) as client:
        async with client.get(url, headers=env.owner_auth) as response:
            assert response.status == 200 and "Workspace editor" in await response.text()
        async with client.get(url, headers={"Accept": "text/html"}, allow_redirects=False) as response:
            assert response.status == 302
            state = response.cookies["_tether_workspaces_state"]
            assert state["secure"] and state["httponly"]
        async with client.ws_connect(url + "ws", headers=env.owner_auth) as ws:
            assert await ws.receive_str(timeout=10) == "hello"


# ---- several kas ---------------------------------------------------------------------------------------


async def test_a_request_at_the_kas_without_the_tunnels_still_works(connected: Env) -> None:
    env = connected
    other_kas, other_port = kas_with_workspaces(env.system)
    assert other_kas.private_url not in await env.system.tunnel_urls(env.agent_id)
    async with browser() as client:
        async with client.get(env.host_url("/", kas_port=other_port), headers=env.owner_auth) as response:
            assert response.status == 200 and "Workspace editor" in await response.text()
        size = 0
        async with client.get(env.path_url("/download?mb=10", kas_port=other_port), headers=env.owner_auth) as response:
            async for chunk in response.content.iter_any():
                size += len(chunk)
        assert size == 10 * MIB
        async with client.ws_connect(env.host_url("/ws", kas_port=other_port), headers=env.owner_auth) as ws:
            assert await ws.receive_str(timeout=10) == "hello"
            await ws.send_str("across kas")
            assert await ws.receive_str(timeout=10) == "echo: across kas"


# ---- bad input -----------------------------------------------------------------------------------------


async def raw_request(port: int, head: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) else 0
    return status, answer


async def test_bad_addresses_get_a_clear_4xx_and_reach_nothing(connected: Env) -> None:
    env = connected
    token = env.owner[1].encode()
    good = f"60001-{env.name}.{ZONE}".encode()
    before, hub_calls = await env.editor_count(), env.system.hub.internal_calls("authorize_workspace_user")
    heads = {
        "two Host headers": b"Host: " + good + b"\r\nHost: 60001-x." + ZONE.encode(),
        "a folded Host": b"Host: " + good + b"\r\n X-Injected: 1",
        "CR in the Host": b"Host: " + good + b"\rX-Injected: 1",
        "encoded CRLF in the Host": b"Host: " + good + b"%0d%0aX-Injected:%201",
        "user info in the Host": b"Host: owner@" + good,
        "a path in the Host": b"Host: " + good + b"/x",
        "a host of another zone": b"Host: 60001-" + env.name.encode() + b".evil.example",
        "two labels before the zone": b"Host: 60001-a." + good,
        "no port label": b"Host: " + env.name.encode() + b"." + ZONE.encode(),
        "a port above 65535": b"Host: 70000-" + env.name.encode() + b"." + ZONE.encode(),
        "no Host": b"X-Nothing: 1",
    }
    for what, head in heads.items():
        request = (
            b"GET / HTTP/1.1\r\n" + head + b"\r\nAuthorization: Bearer " + token + b"\r\nConnection: close\r\n\r\n"
        )
        status, answer = await raw_request(env.port, request)
        assert 400 <= status < 500, (what, answer[:300])
        assert b"X-Injected" not in answer.split(b"\r\n\r\n", 1)[0], what
    for path in (
        f"/-/workspaces/{env.name}/",
        f"/-/workspaces/{env.name.upper()}/60001/",
        f"/-/workspaces/{env.name}/60001x/",
        "/-/workspaces/../60001/",
        "/elsewhere",
        "http://evil.example/",
    ):
        request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{env.port}\r\nConnection: close\r\n".encode()
            + b"Authorization: Bearer "
            + token
            + b"\r\n\r\n"
        )
        status, answer = await raw_request(env.port, request)
        assert 400 <= status < 500, (path, answer[:300])
    assert await env.editor_count() == before
    assert env.system.hub.internal_calls("authorize_workspace_user") == hub_calls


# ---- state changes reach every kas at once ---------------------------------------------------------------


async def test_state_changes_reach_every_kas_at_once(
    tmp_path: Path, redis_server: RedisServer, private_secret_file: Path
) -> None:
    """The hub announces each changed workspace; every kas drops its cached answer (caches kept for a minute)."""
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, None, redis_server)
    try:
        long = {"authorization_cache_ttl": "60s", "authorization_cache_error_ttl": "60s"}
        first, first_port = kas_with_workspaces(system, **long)
        _, second_port = kas_with_workspaces(system, **long)
        launcher.start(hub, {"kas.api_address": first.api_target})
        ws = workspace_setup(hub, RD_CONFIG.replace("workspaces.example.com", ZONE))
        token = ws.setup.tokens["developer"]
        auth = {"Authorization": f"Bearer {token}"}
        name = unique("changing")
        # Before it exists: 403, cached by both kas.
        async with browser() as client:

            async def states() -> list[tuple[int, str]]:
                answers = []
                for port in (first_port, second_port):
                    async with client.get(f"http://60001-{name}.{ZONE}:{port}/", headers=auth) as response:
                        answers.append((response.status, str((await body_of(response))["error"])))
                return answers

            assert await states() == [(403, "Forbidden")] * 2
            created = create_workspace(hub, ws, name=name, devfile=DEVFILE)  # announced: the refusals go
            assert await states() == [(503, "workspace starting")] * 2

            def report(replicas: int, available: int) -> None:
                d = deployment(
                    name, created["namespace"], str(time.monotonic_ns()), replicas, available, "NewReplicaSetAvailable"
                )
                body = {
                    "update_type": "partial",
                    "workspace_agent_infos": [info(name, created["namespace"], latest_k8s_deployment_info=d)],
                }
                assert reconcile(hub, ws, body).status_code == 201

            report(1, 1)  # Running: forwarded now, and no agent is connected
            assert await states() == [(502, "Agent not connected")] * 2
            update = {"id": created["id"], "state": "Stopped"}
            assert graphql(hub, token, UPDATE, update).json()["data"]["workspaceUpdate"]["errors"] == []
            report(0, 0)
            assert await states() == [(503, "workspace stopped")] * 2
    finally:
        system.stop_all()
        launcher.stop_all()


# ---- back-pressure ----------------------------------------------------------------------------------------

#: kas and agentk RSS growth allowed while a client does not read (issue 9's bound for the proxy).
MAX_GROWTH_MIB = 32.0


async def test_a_client_that_stops_reading_stalls_the_workspace_not_kas_memory(connected: Env) -> None:
    env = connected
    agentk = env.system.started[-1]
    assert not isinstance(agentk, KasProc) and agentk.process.popen is not None
    pids = {"kas": env.kas.process.pid, "agentk": agentk.process.pid}  # type: ignore[union-attr]
    before = {name: rss_mib(pid) for name, pid in pids.items()}

    async def sent() -> int:
        async with aiohttp.ClientSession() as direct, direct.get(f"{env.editor.url}/count") as response:
            return int((await response.json())["sent"])

    start = await sent()
    total = 200 * MIB
    reader, writer = await asyncio.open_connection("127.0.0.1", env.port, limit=64 * 1024)
    try:
        writer.write(
            f"GET /download?mb=200 HTTP/1.1\r\nHost: 60001-{env.name}.{ZONE}\r\n"
            f"Authorization: Bearer {env.owner[1]}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200 "), head
        received = len(await asyncio.wait_for(reader.readexactly(64 * 1024), 30))
        # The client stops reading: the editor must stall long before 200 MiB, and nobody buffers the rest.
        last, since, deadline = await sent(), time.monotonic(), time.monotonic() + 90
        while time.monotonic() - since < 3.0:
            assert time.monotonic() < deadline, "the editor never stalled"
            await asyncio.sleep(0.25)
            if (now := await sent()) != last:
                last, since = now, time.monotonic()
        assert last - start < total // 2, f"{(last - start) / MIB:.1f} MiB sent to a client that reads nothing"
        growth = {name: round(rss_mib(pid) - before[name], 1) for name, pid in pids.items()}
        assert all(g < MAX_GROWTH_MIB for g in growth.values()), growth
        # Reading again completes the download.
        while received < total:
            chunk = await asyncio.wait_for(reader.read(1024 * 1024), 30)
            assert chunk, f"the download ended after {received} bytes"
            received += len(chunk)
        assert received == total
    finally:
        writer.close()


# ---- the audit trail (issue 25 item 1) ----------------------------------------------------------------------


async def test_requests_for_a_workspace_are_audited_refused_ones_too(connected: Env) -> None:
    env = connected
    hub = env.system.hub
    async with browser() as client:

        async def owner_get() -> bool:
            async with client.get(env.host_url("/"), headers=env.owner_auth) as response:
                await response.read()
                return response.status == 200

        await poll(owner_get, "the owner's page (the editor may still be busy after the test before)", 30)
        async with client.get(env.host_url("/"), headers={"Authorization": f"Bearer {env.other[1]}"}) as response:
            assert response.status == 403
        async with client.get(env.host_url("/")) as response:
            assert response.status == 401

    def rows() -> list[dict[str, Any]]:
        return hub.db.rows("SELECT * FROM audit_events WHERE kind = 'workspace' AND name = :n", n=env.name)

    poll_sync(lambda: len(rows()) >= 3, "three workspace events at the hub", 30)
    by_status = {row["status"]: row for row in rows()}
    owner = by_status[200]
    assert (owner["user_id"], owner["agent_id"], owner["namespace"]) == (env.owner[0], env.agent_id, env.namespace)
    assert (owner["verb"], owner["path"], owner["token_kind"], owner["resource"]) == (
        "GET",
        "/",
        "personal_access",
        "workspaces",
    )
    assert owner["bytes_out"] > 0 and owner["kas_instance"] == env.kas.private_url and owner["token_id"] > 0
    # Refused: the hub said no (no user known to kas), and no credentials at all.
    assert (by_status[403]["user_id"], by_status[403]["token_kind"]) == (0, "personal_access")
    assert (by_status[401]["user_id"], by_status[401]["token_kind"]) == (0, "")
