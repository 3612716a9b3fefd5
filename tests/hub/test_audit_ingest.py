"""``POST /api/v4/internal/kubernetes/audit_events``: kas JWT, idempotent by id, clear 400s, nothing half-stored."""

from __future__ import annotations

import json
import os

import httpx

from tests.fixtures.hub import RealHub
from tests.hub.audit_helpers import event, post_events
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, mint

PATH = "/internal/kubernetes/audit_events"


def _ids(hub: RealHub) -> list[str]:
    return [row["event_id"] for row in hub.db.rows("SELECT event_id FROM audit_events ORDER BY seq")]


def test_a_batch_is_stored_once_however_often_it_comes(hub: RealHub) -> None:
    first = [event(7, user_id=3, username="alice", token_id=11, token_kind="personal_access") for _ in range(3)]
    response = post_events(hub, first)
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": 3, "duplicates": 0}

    again = post_events(hub, first)  # kas resends a batch whose answer it lost
    assert again.json() == {"accepted": 0, "duplicates": 3}
    extra = event(7, cluster_identity={"kind": "impersonate", "user": "alice", "groups": ["dev", "ops"]})
    mixed = post_events(hub, [first[0], extra, extra])  # one old, one new (twice in the batch)
    assert mixed.json() == {"accepted": 1, "duplicates": 2}
    assert _ids(hub) == [e["id"] for e in first] + [extra["id"]]

    row = hub.db.rows("SELECT * FROM audit_events WHERE event_id = :id", id=extra["id"])[0]
    assert (row["identity_kind"], row["identity_user"], json.loads(row["identity_groups"])) == (
        "impersonate",
        "alice",
        ["dev", "ops"],
    )
    stored = hub.db.rows("SELECT * FROM audit_events WHERE event_id = :id", id=first[0]["id"])[0]
    assert (stored["user_id"], stored["username"], stored["token_id"], stored["token_kind"]) == (
        3,
        "alice",
        11,
        "personal_access",
    )
    assert post_events(hub, []).json() == {"accepted": 0, "duplicates": 0}


def test_only_kas_may_post_events(hub: RealHub) -> None:
    wrong_secret = {"Gitlab-Kas-Api-Request": mint(os.urandom(32), ISSUER_KAS, AUDIENCE_GITLAB, 30)}
    for headers in ({}, wrong_secret, {"PRIVATE-TOKEN": hub.admin_token}):
        with httpx.Client(base_url=hub.api_url, headers=headers, timeout=30) as client:
            response = client.post(PATH, json={"events": [event(1)]})
        assert response.status_code == 401, response.text
        assert "Gitlab-Kas-Api-Request" in response.json()["message"]
    assert _ids(hub) == []


def test_a_malformed_batch_is_refused_whole_with_the_field_named(hub: RealHub) -> None:
    good = event(1)
    bodies: dict[str, tuple[bytes, str]] = {
        "not json": (b"{events:", "not JSON"),
        "no events": (b"{}", "events"),
        "events not a list": (json.dumps({"events": {"a": 1}}).encode(), "$.events"),
        "wrong type": (
            json.dumps({"events": [good, {**good, "id": "0" * 32, "agent_id": "7"}]}).encode(),
            "$.events[1].agent_id",
        ),
        "missing field": (json.dumps({"events": [{k: v for k, v in good.items() if k != "verb"}]}).encode(), "verb"),
        "bad id": (json.dumps({"events": [good, event(1, id="../../x")]}).encode(), "$.events[1].id"),
        "negative agent": (json.dumps({"events": [event(-1)]}).encode(), "$.events[0].agent_id"),
        "negative bytes": (json.dumps({"events": [event(1, bytes_in=-1)]}).encode(), "bytes_in"),
        "beyond int64": (json.dumps({"events": [event(1, user_id=2**64)]}).encode(), "user_id"),
        "time before 1970": (json.dumps({"events": [event(1, time=-5.0)]}).encode(), "$.events[0].time"),
        "time after 9999": (json.dumps({"events": [event(1, time=1e12)]}).encode(), "$.events[0].time"),
        "negative duration": (json.dumps({"events": [event(1, duration_ms=-1.0)]}).encode(), "duration_ms"),
        "empty kind": (json.dumps({"events": [event(1, kind="")]}).encode(), "kind"),
        "too many": (json.dumps({"events": [event(1) for _ in range(1001)]}).encode(), "at most 1000"),
    }
    with httpx.Client(base_url=hub.api_url, headers=hub.kas_headers(), timeout=30) as client:
        for what, (body, named) in bodies.items():
            response = client.post(PATH, content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == 400, (what, response.text)
            assert named in response.json()["message"], (what, response.text)
        big = json.dumps({"events": [event(1, path="/" + "p" * 4000) for _ in range(1000)]}).encode()
        assert len(big) > 4 * 1024 * 1024
        response = client.post(PATH, content=big, headers={"Content-Type": "application/json"})
        assert response.status_code == 413, response.text
        assert "4194304 bytes" in response.json()["message"]
    assert _ids(hub) == [], "nothing of a refused batch is stored"


def test_text_a_client_chooses_cannot_keep_its_event_out(hub: RealHub) -> None:
    """NUL, a lone surrogate or an overlong path would make the database refuse the batch: they are stored."""
    sneaky = [
        event(1, path="/api/v1/namespaces/default/pods/x\u0000y", name="x\u0000y"),
        event(1, path="/" + "a" * 10_000, namespace="n" * 300),
    ]
    body = json.dumps({"events": sneaky}).replace("x\\u0000y", "x\\u0000y\\ud800", 1).encode()
    with httpx.Client(base_url=hub.api_url, headers=hub.kas_headers(), timeout=30) as client:
        response = client.post(PATH, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": 2, "duplicates": 0}
    rows = hub.db.rows("SELECT path, name, namespace FROM audit_events ORDER BY seq")
    assert rows[0]["path"] == "/api/v1/namespaces/default/pods/x\ufffdy\ufffd"
    assert rows[0]["name"] == "x\ufffdy"
    assert (len(rows[1]["path"]), len(rows[1]["namespace"])) == (4096, 253)
