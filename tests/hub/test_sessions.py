"""Browser sessions: the sign-in form, the cookies, ``/users/session``, sign-out, and secrets at rest and in logs."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import httpx
import pytest

from tests.fixtures.hub import HubLauncher, RealHub
from tests.hub.helpers import post_sign_in, set_cookies, sign_in
from tether.hub.config import ConfigError, load_config

WEEK_S = 7 * 24 * 3600


def client(hub: RealHub) -> httpx.Client:
    return httpx.Client(base_url=hub.url, timeout=30)


def session_rows(hub: RealHub) -> list[dict[str, object]]:
    return hub.db.rows("SELECT * FROM user_sessions ORDER BY id")


def test_sign_in_form_sets_both_cookies_and_shows_the_csrf_token(hub: RealHub) -> None:
    form = client(hub).get("/users/sign_in")
    assert form.status_code == 200 and form.headers["content-type"].startswith("text/html")
    assert 'name="login"' in form.text and 'name="token"' in form.text and "api" in form.text
    assert (
        form.headers["cache-control"] == "no-store"
        and "frame-ancestors 'none'" in form.headers["content-security-policy"]
    )

    alice_id, token = hub.user("alice", ("api",))
    response = post_sign_in(hub, "Alice", token)  # the login is case-insensitive
    assert response.status_code == 200, response.text
    cookies = set_cookies(response)
    session = cookies["_gitlab_session"]["_gitlab_session"]
    kas = cookies["_gitlab_kas"]["_gitlab_kas"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", session.value), "32 random bytes, URL-safe"
    assert kas.value == session.value, "the kas cookie is the same id, URL-escaped (a no-op for URL-safe text)"
    for morsel in (session, kas):
        assert morsel["httponly"] is True and morsel["path"] == "/" and int(morsel["max-age"]) == WEEK_S
        assert morsel["samesite"].lower() == "lax" and not morsel["secure"] and not morsel["domain"]

    with client(hub) as c:
        me = c.get("/users/session", headers={"Cookie": f"_gitlab_session={session.value}"})
    assert me.status_code == 200 and me.headers["cache-control"] == "no-store"
    assert set(me.json()) == {"username", "csrf_token"} and me.json()["username"] == "alice"
    csrf = me.json()["csrf_token"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", csrf) and csrf != session.value
    assert f'<pre id="csrf-token">{csrf}</pre>' in response.text and "Signed in as alice" in response.text

    again = client(hub).get("/users/sign_in", headers={"Cookie": f"_gitlab_session={session.value}"})
    assert again.status_code == 200 and csrf in again.text, "a signed-in browser sees its session page"

    rows = session_rows(hub)
    assert len(rows) == 1 and rows[0]["user_id"] == alice_id and rows[0]["last_used_at"] is not None
    assert rows[0]["expires_at"] > rows[0]["created_at"]  # type: ignore[operator]

    _, proxy_only = hub.user("bob", ("k8s_proxy",))
    assert post_sign_in(hub, "bob", proxy_only).status_code == 200, "a k8s_proxy token signs in too"


def test_refused_sign_ins_set_no_cookie_and_create_no_session(hub: RealHub) -> None:
    alice_id, token = hub.user("alice", ("api",))
    _, bob_token = hub.user("bob", ("api",))
    read_only = hub.token_for(alice_id, ("read_api",))
    revoked = hub.token_for(alice_id, ("api",))
    token_id = max(t["id"] for t in hub.api().get("/personal_access_tokens", params={"user_id": alice_id}).json())
    assert hub.api().delete(f"/personal_access_tokens/{token_id}").status_code == 204

    for login, secret in (
        ("alice", "glpat-unknown"),
        ("alice", bob_token),  # another user's token
        ("nobody", token),
        ("alice", read_only),  # neither api nor k8s_proxy
        ("alice", revoked),
    ):
        response = post_sign_in(hub, login, secret)
        assert response.status_code == 401, (login, response.text)
        assert "Invalid login or token." in response.text and not set_cookies(response)

    for data in ({"login": "alice"}, {"login": "", "token": token}):
        with client(hub) as c:
            assert c.post("/users/sign_in", data=data).status_code == 400
    with client(hub) as c:
        assert c.post("/users/sign_in", json={"login": "alice", "token": token}).status_code == 400
        assert c.post("/users/sign_in", data={"login": "alice", "token": "x" * 20000}).status_code == 400
    cross_site = post_sign_in(hub, "alice", token, headers={"Origin": "https://evil.example"})
    assert cross_site.status_code == 403 and not set_cookies(cross_site)
    assert post_sign_in(hub, "alice", token, headers={"Origin": hub.url}).status_code == 200, "same origin passes"
    assert len(session_rows(hub)) == 1

    hub.db.execute("UPDATE users SET state = 'blocked' WHERE id = :id", id=alice_id)
    assert post_sign_in(hub, "alice", token).status_code == 401


def test_session_json_and_sign_out(hub: RealHub) -> None:
    _, token = hub.user("alice", ("api",))
    signed = sign_in(hub, "alice", token)
    with client(hub) as c:
        assert c.get("/users/session").status_code == 401
        unknown = c.get("/users/session", headers={"Cookie": "_gitlab_session=not-a-session"})
        assert unknown.status_code == 401 and "sign in" in unknown.json()["message"]

        for headers in ({}, {"X-Csrf-Token": "wrong"}):
            refused = c.post("/users/sign_out", headers={**signed.headers, **headers})
            assert refused.status_code == 403 and "CSRF" in refused.json()["message"]
        assert c.get("/users/session", headers=signed.headers).status_code == 200, "a refused sign-out keeps it"

        done = c.post("/users/sign_out", headers={**signed.headers, "X-Csrf-Token": signed.csrf_token})
        assert done.status_code == 200 and "You are signed out." in done.text
        cleared = set_cookies(done)
        for name in ("_gitlab_session", "_gitlab_kas"):
            assert cleared[name][name].value == "" and int(cleared[name][name]["max-age"]) == 0
        gone = c.get("/users/session", headers=signed.headers)
        assert gone.status_code == 401 and "signed-out" in gone.json()["message"]
        assert session_rows(hub) == []
        assert c.post("/users/sign_out", headers=signed.headers).status_code == 200, "signing out twice is fine"

        form_user = sign_in(hub, "alice", token)
        by_form = c.post(
            "/users/sign_out", headers=form_user.headers, data={"authenticity_token": form_user.csrf_token}
        )
        assert by_form.status_code == 200 and session_rows(hub) == [], "the sign-out form's hidden field works"


def test_signing_in_again_ends_the_previous_session(hub: RealHub) -> None:
    _, token = hub.user("alice", ("api",))
    first = sign_in(hub, "alice", token)
    response = post_sign_in(hub, "alice", token, headers=first.headers)
    assert response.status_code == 200
    with client(hub) as c:
        assert c.get("/users/session", headers=first.headers).status_code == 401
    assert len(session_rows(hub)) == 1


def test_cookie_domain_and_secure_flag_follow_the_configuration(hub_launcher: HubLauncher) -> None:
    hub = hub_launcher.launch(
        {
            "sessions.kas_cookie_domain": "example.test",
            "external_url": "https://hub.example.test",
            "sessions.lifetime": "2h",
            "kas.k8s_proxy_url": "https://kas.example.test/k8s-proxy/",
        }
    )
    _, token = hub.user("alice", ("api",))
    response = post_sign_in(hub, "alice", token)
    cookies = set_cookies(response)
    kas, session = cookies["_gitlab_kas"]["_gitlab_kas"], cookies["_gitlab_session"]["_gitlab_session"]
    assert kas["domain"] == "example.test" and not session["domain"], "only the kas cookie is shared with kas' host"
    assert kas["secure"] and session["secure"] and int(kas["max-age"]) == 7200
    # Issue 27 item 2: the kas cookie goes only to kas' proxy path, not to every path of the shared domain.
    assert kas["path"] == "/k8s-proxy/" and session["path"] == "/"
    with client(hub) as c:
        signed_in = {"Cookie": f"_gitlab_session={session.value}"}
        csrf = c.get("/users/session", headers=signed_in).json()["csrf_token"]
        done = c.post("/users/sign_out", headers={**signed_in, "X-Csrf-Token": csrf})
    cleared = set_cookies(done)["_gitlab_kas"]["_gitlab_kas"]
    assert cleared["path"] == "/k8s-proxy/" and cleared["domain"] == "example.test" and cleared.value == ""


def test_session_ids_and_csrf_tokens_are_never_stored_or_logged(hub: RealHub) -> None:
    sql_log = logging.getLogger("sqlalchemy.engine")
    sql_log.setLevel(logging.INFO)  # statements and their parameters are captured too
    try:
        _, token = hub.user("alice", ("api",))
        signed = sign_in(hub, "alice", token)
        with client(hub) as c:
            c.get("/users/sign_in", headers=signed.headers)
            c.post("/users/sign_out", headers={**signed.headers, "X-Csrf-Token": "wrong"})
    finally:
        sql_log.setLevel(logging.WARNING)
    stored = repr(session_rows(hub)) + hub.db.all_text()
    logged = hub.log.text
    assert "SELECT" in logged and "user_sessions" in logged, "the SQL log was captured"
    for secret in (signed.session_cookie, signed.kas_cookie, signed.csrf_token):
        assert secret not in stored, "a session secret is in the database"
        assert secret not in logged, "a session secret is in the log"
    row = session_rows(hub)[0]
    assert row["session_digest"] == hashlib.sha256(signed.session_cookie.encode()).hexdigest()
    assert row["csrf_digest"] == hashlib.sha256(signed.csrf_token.encode()).hexdigest()


@pytest.mark.parametrize(("text", "problem"), [("0s", "more than 0s"), ("soon", "invalid duration")])
def test_bad_session_lifetime_is_a_configuration_error(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(None, environ={"TETHER_HUB_SESSION_LIFETIME": text})
    with pytest.raises(ConfigError, match=re.escape("sessions.kas_cookie_domain")):
        load_config(None, environ={}, overrides={"sessions.kas_cookie_domain": "evil; Path=/x"})


def test_sign_out_drops_the_kas_cookie_at_its_former_path_too(tmp_path: Path) -> None:
    """The kas cookie's Path is now kas' proxy path (issue 27 item 2); a browser signed in before still holds one
    at ``Path=/``, which reaches every listener of the host: sign-out drops both."""
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.launch({"kas.k8s_proxy_url": "https://127.0.0.1:8154/k8s-proxy/"})
    try:
        _, token = hub.user("alice", ("api",))
        signed = sign_in(hub, "alice", token)
        with client(hub) as c:
            done = c.post("/users/sign_out", headers={**signed.headers, "X-Csrf-Token": signed.csrf_token})
        assert done.status_code == 200
        kas_paths = {
            line.split("Path=", 1)[1].split(";", 1)[0]
            for line in done.headers.get_list("set-cookie")
            if line.startswith("_gitlab_kas=")
        }
        assert kas_paths == {"/k8s-proxy/", "/"}, kas_paths
    finally:
        launcher.stop_all()
