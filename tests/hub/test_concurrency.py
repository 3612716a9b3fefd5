"""Concurrent writers: a duplicate-name race gives one 201 and 409s, never a 500 or a locked database."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.fixtures.hub import RealHub


def test_racing_duplicate_agents_and_parallel_reads(hub: RealHub) -> None:
    project = hub.api().post("/projects", json={"name": "race"}).json()
    agents = f"/projects/{project['id']}/cluster_agents"

    def create(index: int) -> int:
        with hub.api() as api:
            if index % 2:
                return api.get(agents).status_code
            return api.post(agents, json={"name": "same"}).status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(create, range(32)))
    writes = statuses[0::2]
    assert writes.count(201) == 1 and writes.count(409) == len(writes) - 1, statuses
    assert set(statuses[1::2]) == {200}
    assert [a["name"] for a in hub.api().get(agents).json()] == ["same"]


def test_openapi_document_lists_the_api(hub: RealHub) -> None:
    with hub.api("") as api:
        document = api.get(hub.url + "/openapi.json").json()
    paths = document["paths"]
    for path in (
        "/api/v4/user",
        "/api/v4/projects/{project_id}/cluster_agents",
        "/api/v4/projects/{project_id}/cluster_agents/{agent_id}/tokens/{token_id}",
        "/api/v4/projects/{project_id}/cluster_agents/{agent_id}/configuration",
        "/api/v4/internal/kubernetes/agent_info",
        "/api/v4/internal/kubernetes/authorize_proxy_user",
    ):
        assert path in paths, path
    assert {"APIKeyHeader", "HTTPBearer"} <= set(document["components"]["securitySchemes"])
    put = paths["/api/v4/projects/{project_id}/cluster_agents/{agent_id}/configuration"]["put"]
    assert "application/yaml" in put["requestBody"]["content"]
