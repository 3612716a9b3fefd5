"""``authorize_proxy_user`` with ``access_type: session_cookie``: kas forwarding a browser's ``_gitlab_kas`` cookie
and CSRF token (kas.md §4.5) gets the same answer as with a personal access token, or 401."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from tests.fixtures.hub import RealHub
from tests.hub.helpers import Setup, SignedIn, kas_config, post_sign_in, project_with_agent, sign_in
from tether.hub.db.sessions import UserSession
from tether.hub.db.types import utcnow

AS_AGENT = "user_access:\n  access_as:\n    agent: {}\n  projects:\n  - id: platform/clusters\n"
AS_USER = "user_access:\n  access_as:\n    user: {}\n  projects:\n  - id: platform/clusters\n"


@pytest.fixture
def setup(hub: RealHub) -> Setup:
    return project_with_agent(hub, roles=("reporter", "developer"))


def authorize(hub: RealHub, agent_id: int, access_type: str, key: str, csrf: str = "") -> httpx.Response:
    body = {"agent_id": agent_id, "access_type": access_type, "access_key": key, "csrf_token": csrf}
    with httpx.Client(base_url=f"{hub.api_url}/internal/kubernetes/", headers=hub.kas_headers(), timeout=30) as c:
        return c.post("authorize_proxy_user", json=body)


def by_session(hub: RealHub, setup: Setup, signed: SignedIn, csrf: str | None = None) -> httpx.Response:
    """As kas sends it: the unescaped ``_gitlab_kas`` value and the client's CSRF token."""
    token = signed.csrf_token if csrf is None else csrf
    return authorize(hub, setup.agent_id, "session_cookie", unquote(signed.kas_cookie), token)


def by_token(hub: RealHub, setup: Setup, role: str) -> dict[str, Any]:
    pat = hub.token_for(setup.user_ids[role], ("k8s_proxy",))
    response = authorize(hub, setup.agent_id, "personal_access_token", pat)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("configuration", [AS_AGENT, AS_USER], ids=["access_as_agent", "access_as_user"])
def test_a_session_with_its_csrf_token_is_answered_as_a_token_is(
    hub: RealHub, setup: Setup, configuration: str
) -> None:
    kas_config(hub, setup, configuration)
    signed = sign_in(hub, "developer", setup.tokens["developer"])
    response = by_session(hub, setup, signed)
    assert response.status_code == 200, response.text
    session_answer, token_answer = response.json(), by_token(hub, setup, "developer")
    # The credential's id (audit trail, issue 25): the session's and the token's own, never the credential.
    session_id, token_id = session_answer.pop("audit")["credential_id"], token_answer.pop("audit")["credential_id"]
    assert session_id > 0 and token_id > 0
    assert signed.kas_cookie not in json.dumps(session_answer)
    assert session_answer == token_answer
    assert response.json()["user"] == {"id": setup.user_ids["developer"], "username": "developer"}
    escaped = authorize(hub, setup.agent_id, "session_cookie", signed.kas_cookie, signed.csrf_token)
    assert escaped.status_code == 200, "the cookie value is accepted escaped or not"


def test_bad_csrf_unknown_expired_and_signed_out_sessions_are_401(hub: RealHub, setup: Setup) -> None:
    kas_config(hub, setup, AS_AGENT)
    signed = sign_in(hub, "developer", setup.tokens["developer"])
    other = sign_in(hub, "developer", setup.tokens["developer"])
    for csrf, words in (("", "missing"), ("wrong", "does not belong"), (other.csrf_token, "does not belong")):
        response = by_session(hub, setup, signed, csrf)
        assert response.status_code == 401 and words in response.json()["message"], csrf
    response = authorize(hub, setup.agent_id, "session_cookie", "no-such-session", signed.csrf_token)
    assert response.status_code == 401 and "unknown or signed-out session" in response.json()["message"]
    pat = hub.token_for(setup.user_ids["developer"], ("k8s_proxy",))
    assert authorize(hub, setup.agent_id, "session_cookie", pat, signed.csrf_token).status_code == 401
    assert by_session(hub, setup, signed).status_code == 200

    with httpx.Client(base_url=hub.url, timeout=30) as c:
        out = c.post("/users/sign_out", headers={**signed.headers, "X-Csrf-Token": signed.csrf_token})
    assert out.status_code == 200
    response = by_session(hub, setup, signed)
    assert response.status_code == 401 and "signed-out" in response.json()["message"]

    async def expire(session: AsyncSession) -> None:
        await session.execute(update(UserSession).values(expires_at=utcnow() - timedelta(seconds=1)))

    assert by_session(hub, setup, other).status_code == 200
    hub.db.session(expire)
    response = by_session(hub, setup, other)
    assert response.status_code == 401 and "expired" in response.json()["message"]
    with httpx.Client(base_url=hub.url, timeout=30) as c:
        assert c.get("/users/session", headers=other.headers).status_code == 401
    assert post_sign_in(hub, "developer", setup.tokens["developer"]).status_code == 200
    assert len(hub.db.rows("SELECT id FROM user_sessions")) == 1, "signing in purges expired sessions"


def test_a_session_follows_the_same_authorization_rules(hub: RealHub, setup: Setup) -> None:
    reporter = sign_in(hub, "reporter", setup.tokens["reporter"])
    outsider = sign_in(hub, "outsider", setup.tokens["outsider"])
    response = by_session(hub, setup, reporter)
    assert response.status_code == 403 and "user_access" in response.json()["message"]
    kas_config(hub, setup, AS_AGENT)
    assert by_session(hub, setup, reporter).status_code == 403
    assert by_session(hub, setup, outsider).status_code == 403
    missing = authorize(hub, 999999, "session_cookie", unquote(reporter.kas_cookie), reporter.csrf_token)
    assert missing.status_code == 404

    hub.db.execute("UPDATE users SET state = 'blocked' WHERE id = :id", id=setup.user_ids["reporter"])
    response = by_session(hub, setup, reporter)
    assert response.status_code == 401 and "blocked" in response.json()["message"]
