"""``GET /api/v4/audit_events`` and ``.jsonl``: who sees which events, the filters, pagination and the export."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fixtures.hub import RealHub
from tests.hub.audit_helpers import event, store
from tests.hub.helpers import Setup, project_with_agent


@dataclass
class Trail:
    """Two agents and four events (ids by name), people from :func:`project_with_agent` plus a group maintainer."""

    setup: Setup
    other_agent: int
    ids: dict[str, str]
    group_maintainer: str


@pytest.fixture
def trail(hub: RealHub) -> Trail:
    setup = project_with_agent(hub)
    admin = hub.api()
    other = admin.post("/projects", json={"name": "elsewhere"}).json()["id"]  # root's own project
    other_agent = admin.post(f"/projects/{other}/cluster_agents", json={"name": "staging"}).json()["id"]
    group_id = admin.get("/groups/platform").json()["id"]
    groupie_id, groupie = hub.user("groupie")
    response = admin.post(f"/groups/{group_id}/members", json={"user_id": groupie_id, "access_level": 40})
    assert response.status_code == 201, response.text
    users = setup.user_ids
    now = time.time()
    events = {
        "developer on production": event(
            setup.agent_id, user_id=users["developer"], username="developer", time=now - 30
        ),
        "outsider on staging": event(
            other_agent,
            user_id=users["outsider"],
            username="outsider",
            verb="delete",
            namespace="kube-system",
            time=now - 20,
        ),
        "maintainer on staging": event(
            other_agent, user_id=users["maintainer"], username="maintainer", resource="secrets", time=now - 10
        ),
        "refused on production": event(setup.agent_id, status=401, verb="list", time=now),
    }
    store(hub, list(events.values()))
    return Trail(setup, other_agent, {name: e["id"] for name, e in events.items()}, groupie)


def _names(trail: Trail, listed: list[dict[str, Any]]) -> set[str]:
    by_id = {v: k for k, v in trail.ids.items()}
    return {by_id[e["id"]] for e in listed}


def _jsonl(hub: RealHub, token: str, **params: Any) -> list[dict[str, Any]]:
    response = hub.api(token).get("/audit_events.jsonl", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def test_each_reader_sees_their_own_and_what_they_maintain(hub: RealHub, trail: Trail) -> None:
    tokens = trail.setup.tokens
    expected = {
        hub.admin_token: set(trail.ids),
        tokens["maintainer"]: {"developer on production", "refused on production", "maintainer on staging"},
        trail.group_maintainer: {"developer on production", "refused on production"},
        tokens["developer"]: {"developer on production"},
        tokens["reporter"]: set(),
        tokens["outsider"]: {"outsider on staging"},
    }
    for token, names in expected.items():
        listed = hub.api(token).get("/audit_events")
        assert listed.status_code == 200, listed.text
        assert _names(trail, listed.json()) == names
        assert _names(trail, _jsonl(hub, token)) == names


def test_a_user_cannot_read_another_users_events(hub: RealHub, trail: Trail) -> None:
    """The attacker (a developer) asks for the outsider's events and another project's agent by id: nothing."""
    attacker = hub.api(trail.setup.tokens["developer"])
    victim = trail.setup.user_ids["outsider"]
    for params in ({"user_id": victim}, {"agent_id": trail.other_agent}, {"namespace": "kube-system"}):
        listed = attacker.get("/audit_events", params=params)
        assert listed.status_code == 200, listed.text
        assert listed.json() == [], params
        assert listed.headers["X-Total"] == "0"
        assert _jsonl(hub, trail.setup.tokens["developer"], **params) == []
    assert hub.api("").get("/audit_events").status_code == 401
    _id, proxy_only = hub.user("proxy-only", scopes=("k8s_proxy",))
    assert hub.api(proxy_only).get("/audit_events").status_code == 403
    assert hub.api(proxy_only).get("/audit_events.jsonl").status_code == 403


def test_filters_and_pagination(hub: RealHub, trail: Trail) -> None:
    admin = hub.api()
    cases: list[tuple[dict[str, Any], set[str]]] = [
        ({"agent_id": trail.other_agent}, {"outsider on staging", "maintainer on staging"}),
        ({"user_id": trail.setup.user_ids["developer"]}, {"developer on production"}),
        ({"verb": "delete"}, {"outsider on staging"}),
        ({"resource": "secrets"}, {"maintainer on staging"}),
        ({"namespace": "kube-system"}, {"outsider on staging"}),
        ({"since": time.time() - 15}, {"maintainer on staging", "refused on production"}),
        ({"until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 25))}, {"developer on production"}),
        ({"since": time.time() + 60}, set()),
    ]
    for params, names in cases:
        listed = admin.get("/audit_events", params=params)
        assert listed.status_code == 200, (params, listed.text)
        assert _names(trail, listed.json()) == names, params
        assert _names(trail, _jsonl(hub, hub.admin_token, **params)) == names, params
    for params in ({"since": "yesterday"}, {"until": "nan"}, {"agent_id": "x"}, {"agent_id": 0}, {"verb": "v" * 300}):
        refused = admin.get("/audit_events", params=params)
        assert refused.status_code == 400, (params, refused.text)
        assert refused.json()["error" if "agent_id" in params or "verb" in params else "message"], params

    first = admin.get("/audit_events", params={"per_page": 3})
    assert [e["id"] for e in first.json()] == [
        trail.ids[n] for n in ("refused on production", "maintainer on staging", "outsider on staging")
    ]
    assert (first.headers["X-Total"], first.headers["X-Total-Pages"], first.headers["X-Next-Page"]) == ("4", "2", "2")
    second = admin.get("/audit_events", params={"per_page": 3, "page": 2})
    assert [e["id"] for e in second.json()] == [trail.ids["developer on production"]]
    assert second.headers["X-Next-Page"] == "" and 'rel="prev"' in second.headers["Link"]
    shown = second.json()[0]
    assert shown["time"].endswith("Z") and shown["cluster_identity"] == {"kind": "agent", "user": "", "groups": []}
    assert (shown["agent_id"], shown["verb"], shown["resource"], shown["status"]) == (
        trail.setup.agent_id,
        "get",
        "pods",
        200,
    )


def test_the_export_continues_after_a_cursor(hub: RealHub, trail: Trail) -> None:
    lines = _jsonl(hub, hub.admin_token)
    assert [line["id"] for line in lines] == list(trail.ids.values()), "arrival order"
    late = event(trail.setup.agent_id, time=time.time() - 3600)  # spooled by kas during an outage: early time
    store(hub, [late])
    after = _jsonl(hub, hub.admin_token, after=lines[-1]["cursor"])
    assert [line["id"] for line in after] == [late["id"]]
    assert _jsonl(hub, hub.admin_token, after=after[-1]["cursor"]) == []


def test_beyond_ten_thousand_events_no_total_as_gitlab(hub: RealHub, hub_backend: str) -> None:
    """GitLab leaves out ``X-Total``, ``X-Total-Pages`` and the ``last`` link above 10,000 items."""
    numbers = (
        "SELECT printf('%032x', x) AS id, x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
        "WHERE x < 10001) SELECT x FROM c)"
        if hub_backend == "sqlite"
        else "SELECT lpad(to_hex(x), 32, '0') AS id, x FROM generate_series(1, 10001) AS x"
    )
    columns = (
        "kas_instance, verb, username, token_kind, identity_kind, identity_user, identity_groups, api_group, "
        "api_version, resource, subresource, namespace, name, path, request_id, source_address, recording"
    )
    blanks = ", ".join("'get'" if c == "verb" else "''" for c in columns.split(", "))
    hub.db.execute(
        f"INSERT INTO audit_events (event_id, time, received_at, kind, agent_id, status, duration_ms, bytes_in, "
        f"bytes_out, user_id, token_id, {columns}) SELECT n.id, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'grpc', n.x, "
        f"200, 1.0, 0, 0, 0, 0, {blanks} FROM ({numbers}) AS n"
    )
    listed = hub.api().get("/audit_events", params={"per_page": 100, "page": 2})
    assert listed.status_code == 200, listed.text
    assert len(listed.json()) == 100
    assert "X-Total" not in listed.headers and "X-Total-Pages" not in listed.headers
    assert (listed.headers["X-Next-Page"], listed.headers["X-Prev-Page"]) == ("3", "1")
    assert 'rel="last"' not in listed.headers["Link"]
    last = hub.api().get("/audit_events", params={"per_page": 100, "page": 101})
    assert (len(last.json()), last.headers["X-Next-Page"]) == (1, "")
