"""Recorded exec/attach sessions at the hub (issue 25 item 2): kas' PUT, the replay file's visibility, the
per-agent switch in the agent configuration and what ``authorize_proxy_user`` tells kas about it.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.fixtures.hub import HubLauncher, RealHub
from tests.hub.helpers import Setup, kas_config, project_with_agent, sign_in
from tether.hub.db import migrate
from tether.hub.db.agents import AgentConfiguration
from tether.hub.db.audit_recordings import AuditRecording
from tether.hub.db.engine import Database
from tether.hub.service import audit_recordings, audit_retention
from tether.modserver.gitlab_client import AgentConfigurationDoc, AgentInfo
from tether.modules.agent_configuration.server import agent_configuration

CAST = b'{"version": 2, "width": 80, "height": 24, "timestamp": 1}\n[0.1, "o", "hello\\r\\n"]\n'


def put_recording(
    hub: RealHub, event_id: str, body: bytes, *, agent_id: int, user_id: int, complete: str = "true"
) -> httpx.Response:
    """kas' ``PUT /api/v4/internal/kubernetes/audit_events/{id}/recording``."""
    headers = {
        **hub.kas_headers(),
        "Content-Type": "application/x-asciicast",
        "Tether-Recording-Complete": complete,
        "Tether-Agent-Id": str(agent_id),
        "Tether-User-Id": str(user_id),
    }
    with httpx.Client(base_url=hub.api_url, timeout=60) as client:
        return client.put(f"/internal/kubernetes/audit_events/{event_id}/recording", content=body, headers=headers)


@pytest.fixture
def setup(hub: RealHub) -> Setup:
    return project_with_agent(hub)


def test_recording_is_replayed_by_its_user_maintainers_and_admins_only(hub: RealHub, setup: Setup) -> None:
    event_id = uuid.uuid4().hex
    developer = setup.user_ids["developer"]
    response = put_recording(hub, event_id, CAST, agent_id=setup.agent_id, user_id=developer)
    assert response.status_code == 204, response.text
    readers = {
        "admin": (hub.admin_token, 200),
        "developer": (setup.tokens["developer"], 200),  # their own session
        "maintainer": (setup.tokens["maintainer"], 200),  # maintains the agent's project
        "reporter": (setup.tokens["reporter"], 404),  # another user's session, not a maintainer
        "guest": (setup.tokens["guest"], 404),
        "outsider": (setup.tokens["outsider"], 404),
    }
    for name, (token, status) in readers.items():
        answer = hub.api(token).get(f"/audit_events/{event_id}/recording")
        assert answer.status_code == status, (name, answer.text)
        if status == 200:
            assert answer.content == CAST, name
            assert answer.headers["content-type"] == "application/x-asciicast"
            assert answer.headers["tether-recording-complete"] == "true"
    # The same refusal for an id that does not exist: ids of other users' sessions are not confirmed.
    missing = hub.api(setup.tokens["reporter"]).get(f"/audit_events/{uuid.uuid4().hex}/recording")
    assert (
        missing.status_code == 404
        and missing.json() == hub.api(setup.tokens["reporter"]).get(f"/audit_events/{event_id}/recording").json()
    )

    # The console serves the same file to a signed-in browser, with the same rule.
    for name, status in (("developer", 200), ("reporter", 404)):
        browser = sign_in(hub, name, setup.tokens[name])
        with httpx.Client(base_url=hub.url, headers=browser.headers, timeout=60) as client:
            assert client.get(f"/-/audit/{event_id}/recording.cast").status_code == status, name
            page = client.get(f"/-/audit/{event_id}/recording")
            assert page.status_code == status, name
            if status == 200:
                assert "asciinema-player.min.js" in page.text and "incomplete" not in page.text
                # WebAssembly for the player's terminal, and nothing more: no JavaScript eval, no inline script.
                policy = page.headers["content-security-policy"]
                assert "script-src 'self' 'wasm-unsafe-eval';" in policy and "'unsafe-eval'" not in policy


def test_second_put_replaces_and_says_incomplete(hub: RealHub, setup: Setup) -> None:
    event_id = uuid.uuid4().hex
    assert put_recording(hub, event_id, CAST, agent_id=setup.agent_id, user_id=0).status_code == 204
    shorter = CAST.splitlines(keepends=True)[0]
    assert (
        put_recording(hub, event_id, shorter, agent_id=setup.agent_id, user_id=0, complete="false").status_code == 204
    )
    answer = hub.api().get(f"/audit_events/{event_id}/recording")
    assert answer.content == shorter and answer.headers["tether-recording-complete"] == "false"


def test_bad_puts_are_refused_and_store_nothing(hub: RealHub, setup: Setup) -> None:
    good = uuid.uuid4().hex
    cases = [
        ("NOT-AN-ID", {}, 400),
        (good, {"complete": "maybe"}, 400),
        (good, {"agent_id": -1}, 400),
    ]
    for event_id, extra, status in cases:
        kwargs = {"agent_id": setup.agent_id, "user_id": 0, **extra}
        response = put_recording(hub, event_id, CAST, **kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, (event_id, extra, response.text)
    assert hub.api().get(f"/audit_events/{good}/recording").status_code == 404
    with httpx.Client(base_url=hub.api_url, timeout=60) as client:  # no kas JWT
        assert client.put(f"/internal/kubernetes/audit_events/{good}/recording", content=CAST).status_code == 401


def test_recording_over_the_cap_gets_413(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch({"audit": {"recording_max_bytes": 2048}})
    event_id = uuid.uuid4().hex
    response = put_recording(hub, event_id, CAST + b'[0.2, "o", "' + b"x" * 4096 + b'"]\n', agent_id=1, user_id=0)
    assert response.status_code == 413, response.text
    assert put_recording(hub, event_id, CAST, agent_id=1, user_id=0).status_code == 204


def test_record_sessions_switch_in_the_agent_configuration(hub: RealHub, setup: Setup) -> None:
    base = "user_access:\n  access_as:\n    agent: {}\n  projects:\n  - id: platform/clusters\n"
    path = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration"
    for bad, field in (
        ("audit: yes\n", "configuration.audit"),
        ("audit:\n  record_sessions: 'yes'\n", "configuration.audit.record_sessions"),
        ("audit:\n  record_session: true\n", "configuration.audit.record_session"),
    ):
        response = hub.api().put(path, content=(base + bad).encode())
        assert response.status_code == 400 and field in response.text, (bad, response.text)

    developer = hub.token_for(setup.user_ids["developer"], ("k8s_proxy",))
    body = {"agent_id": setup.agent_id, "access_type": "personal_access_token", "access_key": developer}
    with httpx.Client(base_url=hub.api_url + "/internal/kubernetes/", headers=hub.kas_headers(), timeout=60) as kas:
        kas_config(hub, setup, base)
        assert "record_sessions" not in kas.post("authorize_proxy_user", json=body).json()["audit"]  # off
        kas_config(hub, setup, base + "audit:\n  record_sessions: true\n")
        assert kas.post("authorize_proxy_user", json=body).json()["audit"]["record_sessions"] is True

    # kas keeps the section for itself: agentk's configuration still parses and does not carry it.
    document = hub.db.session(lambda session: session.get(AgentConfiguration, setup.agent_id))
    assert document is not None and document.document["audit"] == {"record_sessions": True}
    doc = AgentConfigurationDoc(commit_id="x", configuration=document.document, project_path="platform/clusters")
    sent = agent_configuration(doc, AgentInfo(setup.agent_id, setup.project_id, "production"), "http://hub")
    assert sent.agent_id == setup.agent_id


def test_retention_deletes_old_recordings_with_old_events(hub_database_url: str) -> None:
    async def check() -> None:
        db = Database(hub_database_url)
        try:
            await migrate.upgrade(db.engine)
            old, recent = uuid.uuid4().hex, uuid.uuid4().hex
            async with db.transaction() as session:
                for event_id in (old, recent):
                    await audit_recordings.store(session, event_id, 1, 0, True, CAST)
            async with db.transaction() as session:
                row = await session.get_one(AuditRecording, old)
                row.stored_at = datetime.now(UTC) - timedelta(days=31)
            assert await audit_retention.sweep(db, 0) == 0  # 0 keeps everything
            async with db.transaction(read_only=True) as session:
                assert await session.get(AuditRecording, old) is not None
            await audit_retention.sweep(db, 30, chunk=1)
            async with db.transaction(read_only=True) as session:
                assert await session.get(AuditRecording, old) is None
                assert await session.get(AuditRecording, recent) is not None
        finally:
            await db.close()

    asyncio.run(check())
