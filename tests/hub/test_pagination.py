"""GitLab pagination headers on every list, and python-gitlab following them."""

from __future__ import annotations

import httpx

from tests.fixtures.hub import RealHub


def test_pagination_headers_and_links(hub: RealHub) -> None:
    api = hub.api()
    project = api.post("/projects", json={"name": "many"}).json()
    agents = f"/projects/{project['id']}/cluster_agents"
    for index in range(25):
        assert api.post(agents, json={"name": f"agent-{index:02d}"}).status_code == 201

    response = api.get(agents, params={"per_page": 10, "page": 2})
    assert response.status_code == 200
    assert [a["name"] for a in response.json()] == [f"agent-{i:02d}" for i in range(10, 20)]
    headers = response.headers
    assert (headers["X-Page"], headers["X-Per-Page"], headers["X-Total"], headers["X-Total-Pages"]) == (
        "2",
        "10",
        "25",
        "3",
    )
    assert (headers["X-Next-Page"], headers["X-Prev-Page"]) == ("3", "1")
    links = response.links
    assert set(links) == {"prev", "next", "first", "last"}
    next_url = httpx.URL(links["next"]["url"])
    assert str(next_url.copy_with(query=None)) == f"{hub.api_url}{agents}"
    assert dict(next_url.params) == {"per_page": "10", "page": "3"}
    assert httpx.URL(links["last"]["url"]).params["page"] == "3"

    last = api.get(links["last"]["url"])
    assert len(last.json()) == 5
    assert last.headers["X-Next-Page"] == "" and last.headers["X-Prev-Page"] == "2" and "next" not in last.links

    first = api.get(agents)
    assert first.headers["X-Per-Page"] == "20" and first.headers["X-Prev-Page"] == "" and len(first.json()) == 20
    assert api.get(agents, params={"per_page": 1000}).headers["X-Per-Page"] == "100"
    beyond = api.get(agents, params={"page": 9})
    assert beyond.json() == [] and beyond.headers["X-Total"] == "25"
    assert api.get(agents, params={"per_page": 0}).status_code == 400

    gl = hub.gitlab()
    everything = gl.projects.get(project["id"]).cluster_agents.list(get_all=True, per_page=7)
    assert len(everything) == 25


def test_every_list_is_paginated(hub: RealHub) -> None:
    api = hub.api()
    project = api.post("/projects", json={"name": "p"}).json()
    group = api.post("/groups", json={"name": "g", "path": "g"}).json()
    agent = api.post(f"/projects/{project['id']}/cluster_agents", json={"name": "a"}).json()
    for path in (
        "/users",
        "/groups",
        "/projects",
        "/personal_access_tokens",
        f"/groups/{group['id']}/subgroups",
        f"/groups/{group['id']}/projects",
        f"/groups/{group['id']}/members",
        f"/groups/{group['id']}/members/all",
        f"/projects/{project['id']}/members",
        f"/projects/{project['id']}/members/all",
        f"/projects/{project['id']}/cluster_agents",
        f"/projects/{project['id']}/cluster_agents/{agent['id']}/tokens",
    ):
        response = api.get(path)
        assert response.status_code == 200, path
        for header in ("X-Page", "X-Per-Page", "X-Total", "X-Total-Pages", "X-Next-Page", "X-Prev-Page", "Link"):
            assert header in response.headers, (path, header)
        assert response.headers["x-total"] == str(len(response.json())), path
