"""Tokens are never stored or logged in plain text: only SHA-256 digests reach the database, nothing reaches logs."""

from __future__ import annotations

import hashlib
import logging

import httpx

from tests.fixtures.hub import RealHub
from tests.hub.helpers import project_with_agent


def test_tokens_never_stored_or_logged_in_plain_text(hub: RealHub) -> None:
    sql_log = logging.getLogger("sqlalchemy.engine")
    sql_log.setLevel(logging.INFO)  # every statement and its parameters end up in the captured log too
    try:
        setup = project_with_agent(hub, roles=("maintainer",))
        api = hub.api()
        tokens_path = f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens"
        agent_token = api.post(tokens_path, json={"name": "a"}).json()["token"]
        pat = hub.token_for(setup.user_ids["maintainer"], ("api", "k8s_proxy"))
        plain = [agent_token, pat, hub.admin_token, *setup.tokens.values()]

        # Use every kind of token on every path that reads one.
        assert hub.api(pat).get("/user").status_code == 200
        internal = httpx_internal(hub)
        assert internal.get("agent_info", headers={"Authorization": f"Bearer {agent_token}"}).status_code == 200
        assert internal.get("agent_configuration", headers={"Gitlab-Agent-Api-Request": agent_token}).status_code == 200
        assert internal.get("agent_info", headers={"Authorization": f"Bearer {agent_token}x"}).status_code == 401
        body = {"agent_id": setup.agent_id, "access_type": "personal_access_token", "access_key": pat}
        assert internal.post("authorize_proxy_user", json=body).status_code in (200, 403)
        assert hub.api(pat + "x").get("/user").status_code == 401
    finally:
        sql_log.setLevel(logging.WARNING)

    stored = hub.db.all_text()
    logged = hub.log.text
    assert "SELECT" in logged, "the SQL log was captured"
    for token in plain:
        assert token not in stored, "a plain token is in the database"
        assert token not in logged, "a plain token is in the log"
        assert token.split("-", 1)[1] not in logged
    digests = {r["token_digest"] for r in hub.db.rows("SELECT token_digest FROM cluster_agent_tokens")}
    assert hashlib.sha256(agent_token.encode()).hexdigest() in digests
    digests = {r["token_digest"] for r in hub.db.rows("SELECT token_digest FROM personal_access_tokens")}
    assert hashlib.sha256(pat.encode()).hexdigest() in digests


def httpx_internal(hub: RealHub) -> httpx.Client:
    return httpx.Client(base_url=f"{hub.api_url}/internal/kubernetes/", headers=hub.kas_headers(), timeout=30)
