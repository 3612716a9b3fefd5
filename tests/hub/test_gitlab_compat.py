"""What GitLab clients and upstream kas need from the hub beyond the resources (issue 11).

Instance metadata with kas addresses, ``/personal_access_tokens/self`` for any scope, GitLab's ``invalid_token``
body, descendant groups, the internal endpoints upstream kas calls, and the Gitaly-compatible service that
serves agent configuration files to upstream kas.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import grpc
import httpx
import pytest

from tests.fixtures.hub import HubLauncher, RealHub
from tests.hub.helpers import Setup, kas_config, project_with_agent
from tether.hub.config import ConfigError
from tether.hub.gitaly import advertisement, sign_v2
from tether.pb.gitlab.agent.gitaly_compat import gitaly_pb2, gitaly_pb2_grpc
from tether_devenv.process import free_port

KAS_URL = "grpc://kas.example.com:8150"
PROXY_URL = "https://kas.example.com/k8s-proxy/"


def internal(hub: RealHub) -> httpx.Client:
    return httpx.Client(base_url=f"{hub.api_url}/internal/kubernetes/", headers=hub.kas_headers(), timeout=30)


def agent_token(hub: RealHub, setup: Setup) -> str:
    path = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
    response = hub.api().post(path, json={"name": "t"})
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


def test_metadata_publishes_the_configured_kas_addresses_to_any_token(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch({"kas.external_url": KAS_URL, "kas.k8s_proxy_url": PROXY_URL})
    user_id, _ = hub.user("dev")
    proxy_only = hub.token_for(user_id, ("k8s_proxy",))
    body = hub.api(proxy_only).get("/metadata").json()
    assert body["kas"] == {
        "enabled": True,
        "externalUrl": KAS_URL,
        "externalK8sProxyUrl": PROXY_URL,
        "version": body["version"],
    }
    assert body["enterprise"] is False and body["revision"]
    assert hub.api("").get("/metadata").status_code == 401
    assert hub.api("glpat-unknown").get("/metadata").status_code == 401


def test_metadata_without_kas_reports_it_disabled(hub: RealHub) -> None:
    kas = hub.api().get("/metadata").json()["kas"]
    assert kas == {"enabled": False, "externalUrl": None, "externalK8sProxyUrl": None, "version": None}


def test_hub_refuses_a_kas_url_that_is_not_one(hub_launcher: HubLauncher) -> None:
    with pytest.raises(ConfigError, match=r"kas\.external_url: .*'kas\.example\.com:8150' is not a URL"):
        hub_launcher.launch({"kas.external_url": "kas.example.com:8150"})


def test_token_self_reads_with_any_scope_and_revoked_or_expired_get_gitlabs_body(hub: RealHub) -> None:
    user_id, _ = hub.user("dev")
    proxy_only = hub.token_for(user_id, ("k8s_proxy",))
    me = hub.api(proxy_only).get("/personal_access_tokens/self")
    assert me.status_code == 200 and me.json()["scopes"] == ["k8s_proxy"] and me.json()["revoked"] is False
    assert hub.api(proxy_only).get("/user").status_code == 403  # other reads still need api/read_api

    assert hub.api().delete(f"/personal_access_tokens/{me.json()['id']}").status_code == 204
    revoked = hub.api(proxy_only).get("/personal_access_tokens/self")
    assert revoked.status_code == 401
    assert revoked.json() == {
        "error": "invalid_token",
        "error_description": "Token was revoked. You have to re-authorize from the user.",
    }

    expiring = hub.token_for(user_id, ("api",))
    token_id = hub.api(expiring).get("/personal_access_tokens/self").json()["id"]
    hub.db.execute("UPDATE personal_access_tokens SET expires_at = '2001-01-01' WHERE id = :id", id=token_id)
    expired = hub.api(expiring).get("/user")
    assert expired.status_code == 401
    assert expired.json() == {"error": "invalid_token", "error_description": "Token has expired."}
    unknown = hub.api("glpat-never-issued").get("/personal_access_tokens/self")
    assert unknown.status_code == 401 and "error" not in unknown.json()


def test_descendant_groups_lists_every_depth_to_members_only(hub: RealHub) -> None:
    admin = hub.api()
    top = admin.post("/groups", json={"name": "Top", "path": "top_1"}).json()
    child = admin.post("/groups", json={"name": "Child", "path": "child", "parent_id": top["id"]}).json()
    grandchild = admin.post("/groups", json={"name": "Leaf", "path": "leaf", "parent_id": child["id"]}).json()
    # A sibling whose path shares the prefix must not match ("top_1" vs "top_10": LIKE wildcards are escaped).
    admin.post("/groups", json={"name": "Other", "path": "top_10"})
    listed = admin.get(f"/groups/{top['id']}/descendant_groups").json()
    assert [g["full_path"] for g in listed] == ["top_1/child", "top_1/child/leaf"]
    assert [g["id"] for g in admin.get("/groups/top_1%2Fchild/descendant_groups").json()] == [grandchild["id"]]
    _, outsider = hub.user("outsider")
    assert hub.api(outsider).get(f"/groups/{top['id']}/descendant_groups").status_code in (403, 404)
    assert admin.get("/groups/999999/descendant_groups").status_code == 404


def test_job_allowed_agents_refuses_every_job_token(hub: RealHub) -> None:
    response = httpx.get(f"{hub.api_url}/job/allowed_agents", headers={"JOB-TOKEN": "anything"})
    assert response.status_code == 401


def test_internal_endpoints_upstream_kas_calls(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=())
    token = agent_token(hub, setup)
    agent = {"Authorization": f"Bearer {token}"}
    client = internal(hub)
    usage = {"counters": {"k8s_api_proxy_request": 3}, "unique_counters": {"agent_users_using_ci_tunnel": [1, 2]}}
    assert client.post("usage_metrics", json=usage).status_code == 204
    assert client.post("usage_metrics", json={"counters": {"x": "many"}}).status_code == 400
    assert client.post("usage_metrics", json={"counters": {str(i): 1 for i in range(1000)}}).status_code == 400
    assert (
        client.post(
            "agent_events", json={"events": {"k8s_api_proxy_requests_unique_users_via_ci_access": []}}
        ).status_code
        == 204
    )
    assert client.post("agent_configuration", json={"agent_id": setup.agent_id, "agent_config": {}}).status_code == 204
    assert client.post("agent_configuration", json={"agent_id": 424242, "agent_config": {}}).status_code == 404

    info = client.get("project_info", params={"id": "platform/clusters"}, headers=agent)
    assert info.status_code == 200, info.text
    assert info.json()["project_id"] == setup.project_id
    assert info.json()["gitaly_repository"]["gl_repository"] == f"project-{setup.project_id}"
    assert client.get("verify_project_access", params={"id": setup.project_id}, headers=agent).status_code == 204
    elsewhere = hub.api().post("/projects", json={"name": "elsewhere"}).json()  # the admin's personal namespace
    assert client.get("verify_project_access", params={"id": elsewhere["id"]}, headers=agent).status_code == 404
    assert client.get("project_info", params={"id": elsewhere["id"]}, headers=agent).status_code == 404
    assert client.get("verify_project_access", params={"id": setup.project_id}).status_code == 401

    assert client.get("receptive_agents").json() == {"agents": []}
    module = client.put("modules/starboard_vulnerability/scan_result", headers=agent, json={})
    assert module.status_code == 404 and "starboard_vulnerability" in module.json()["message"]
    assert client.get("agent/1/whatever").status_code == 404

    no_jwt = httpx.post(f"{hub.api_url}/internal/kubernetes/usage_metrics", json=usage)
    assert no_jwt.status_code == 401


def _call_gitaly(port: int, token: str, work: Any) -> Any:
    async def go() -> Any:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            metadata = (("authorization", f"Bearer {sign_v2(token)}"),)
            return await work(channel, metadata)

    return asyncio.run(go())


def test_gitaly_service_serves_agent_configuration_files(hub_launcher: HubLauncher) -> None:
    port = free_port()
    hub = hub_launcher.launch({"gitaly.listen": f"127.0.0.1:{port}"})
    setup = project_with_agent(hub, roles=())
    token = agent_token(hub, setup)
    info = internal(hub).get("agent_info", headers={"Authorization": f"Bearer {token}"}).json()
    gitaly_token = info["gitaly_info"]["token"]
    assert info["gitaly_info"]["address"] == f"tcp://127.0.0.1:{port}" and len(gitaly_token) >= 32
    repo = gitaly_pb2.Repository(**info["gitaly_repository"])
    path = b".gitlab/agents/production/config.yaml"

    async def refs(channel: grpc.aio.Channel, metadata: Any) -> bytes:
        stub = gitaly_pb2_grpc.SmartHTTPServiceStub(channel)
        return b"".join(
            [
                r.data
                async for r in stub.InfoRefsUploadPack(gitaly_pb2.InfoRefsRequest(repository=repo), metadata=metadata)
            ]
        )

    async def entry(
        channel: grpc.aio.Channel, metadata: Any, wanted: bytes = path
    ) -> list[gitaly_pb2.TreeEntryResponse]:
        stub = gitaly_pb2_grpc.CommitServiceStub(channel)
        request = gitaly_pb2.TreeEntryRequest(repository=repo, revision=b"HEAD", path=wanted, max_size=131072)
        return [r async for r in stub.TreeEntry(request, metadata=metadata)]

    before = _call_gitaly(port, gitaly_token, refs)
    match = re.search(rb"([0-9a-f]{40}) refs/heads/main\n", before)
    assert match is not None
    assert before == advertisement(match[1].decode(), "main")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        _call_gitaly(port, gitaly_token, entry)  # no configuration stored yet: kas runs the agent on defaults
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND

    kas_config(hub, setup, "observability:\n  logging:\n    level: debug\n")
    after = _call_gitaly(port, gitaly_token, refs)
    assert after != before
    blob = _call_gitaly(port, gitaly_token, entry)
    assert blob[0].type == gitaly_pb2.TreeEntryResponse.BLOB
    assert b"".join(r.data for r in blob) == b"observability:\n  logging:\n    level: debug\n"

    for wrong in ("not-the-token", ""):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            _call_gitaly(port, wrong or "x", refs) if wrong else asyncio.run(_unsigned(port, repo))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for other in (b".gitlab/agents/../../etc/passwd", b"README.md", b".gitlab/agents/unknown/config.yaml"):
        with pytest.raises(grpc.aio.AioRpcError) as not_found:
            _call_gitaly(port, gitaly_token, lambda c, m, o=other: entry(c, m, o))
        assert not_found.value.code() == grpc.StatusCode.NOT_FOUND
    other_repo = gitaly_pb2.Repository(storage_name="tether", gl_repository="project-999999")

    async def unknown_repo(channel: grpc.aio.Channel, metadata: Any) -> Any:
        stub = gitaly_pb2_grpc.SmartHTTPServiceStub(channel)
        return [
            r
            async for r in stub.InfoRefsUploadPack(gitaly_pb2.InfoRefsRequest(repository=other_repo), metadata=metadata)
        ]

    with pytest.raises(grpc.aio.AioRpcError) as no_repo:
        _call_gitaly(port, gitaly_token, unknown_repo)
    assert no_repo.value.code() == grpc.StatusCode.NOT_FOUND


async def _unsigned(port: int, repo: gitaly_pb2.Repository) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gitaly_pb2_grpc.SmartHTTPServiceStub(channel)
        return [r async for r in stub.InfoRefsUploadPack(gitaly_pb2.InfoRefsRequest(repository=repo))]


def test_raw_repository_file_serves_agent_configuration_files_only(hub: RealHub) -> None:
    setup = project_with_agent(hub)
    base = f"/projects/{setup.project_id}/repository/files"
    config = ".gitlab%2Fagents%2Fproduction%2Fconfig.yaml"
    assert hub.api().get(f"{base}/{config}/raw").status_code == 404  # no configuration stored yet
    kas_config(hub, setup, "observability:\n  logging:\n    level: debug\n")
    raw = hub.api().get(f"{base}/{config}/raw", params={"ref": "main"})
    assert raw.status_code == 200 and raw.text == "observability:\n  logging:\n    level: debug\n"
    by_path = hub.api().get(f"/projects/platform%2Fclusters/repository/files/{config}/raw")
    assert by_path.text == raw.text
    assert hub.api(setup.tokens["developer"]).get(f"{base}/{config}/raw").status_code == 200
    assert hub.api(setup.tokens["reporter"]).get(f"{base}/{config}/raw").status_code == 403
    assert hub.api(setup.tokens["outsider"]).get(f"{base}/{config}/raw").status_code == 404
    for other in ("README.md", ".gitlab%2Fagents%2F..%2F..%2Fetc%2Fpasswd", ".gitlab%2Fagents%2Fnone%2Fconfig.yaml"):
        missing = hub.api().get(f"{base}/{other}/raw")
        assert missing.status_code == 404 and missing.json() == {"message": "404 File Not Found"}
