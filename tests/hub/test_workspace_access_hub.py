"""The hub's side of reaching a workspace: ``authorize_workspace_user`` (owner only) and the browser sign-in."""

from __future__ import annotations

import os
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.fixtures.hub import RealHub
from tests.hub.helpers import sign_in
from tests.hub.workspace_helpers import RD_CONFIG, create, workspace_setup
from tether.modules.workspace_access import ACCESS_PAT, ACCESS_SESSION, HUB_SIGN_IN_PATH
from tether.modules.workspace_access.rpc.tokens import AuthorizeRequest, SignInCode, WorkspaceSession, nonce_digest

ZONE = "workspaces.example.com"
CALLBACK = "https://60001-ws.workspaces.example.com/-/workspaces/-/callback"


def authorize(
    hub: RealHub, name: str, access_key: str, access_type: str = ACCESS_PAT, zone: str | None = ZONE
) -> httpx.Response:
    body = {"workspace": name, "dns_zone": zone, "access_type": access_type, "access_key": access_key}
    return httpx.post(
        hub.api_url + "/internal/kubernetes/authorize_workspace_user", json=body, headers=hub.kas_headers(), timeout=30
    )


def test_only_the_owner_is_authorized_and_others_cannot_tell_what_exists(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    created = create(hub, ws, name="dev-box")
    owner_token = ws.setup.tokens["developer"]

    answer = authorize(hub, "dev-box", owner_token)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["workspace"] == {
        "id": int(created["id"].rsplit("/", 1)[1]),
        "name": "dev-box",
        "namespace": created["namespace"],
        "service": "dev-box",
        "agent_id": ws.setup.agent_id,
        "project_id": ws.setup.project_id,
        "ports": [8080],
        "actual_state": "CreationRequested",
        "desired_state": "Running",
        "message": "",
    }
    assert body["user"] == {"id": ws.setup.user_ids["developer"], "username": "developer"}
    assert body["audit"] == {"credential_id": hub.token_id(owner_token)}, "the token's id for the audit trail"
    assert authorize(hub, "dev-box", owner_token, zone=None).status_code == 200  # the path form
    read_only = hub.token_for(ws.setup.user_ids["developer"], ("read_api",))
    assert authorize(hub, "dev-box", read_only).status_code == 200

    # Another user, an administrator included, and a name nobody has: the same 403.
    refusals = [
        authorize(hub, "dev-box", ws.setup.tokens["maintainer"]),
        authorize(hub, "dev-box", hub.admin_token),
        authorize(hub, "no-such-box", owner_token),
        authorize(hub, "dev-box", owner_token, zone="other.example.com"),
    ]
    assert {(r.status_code, r.text) for r in refusals} == {(403, refusals[0].text)}

    k8s_only = hub.token_for(ws.setup.user_ids["developer"], ("k8s_proxy",))
    for key, kind in ((k8s_only, ACCESS_PAT), ("not-a-token", ACCESS_PAT), (owner_token, "session_cookie")):
        assert authorize(hub, "dev-box", key, kind).status_code == 401, (key, kind)
    revoked = hub.token_for(ws.setup.user_ids["developer"], ("api",))
    assert hub.api(revoked).delete("/personal_access_tokens/self").status_code == 204
    assert authorize(hub, "dev-box", revoked).status_code == 401
    # Without kas' JWT nothing is answered.
    anonymous = httpx.post(
        hub.api_url + "/internal/kubernetes/authorize_workspace_user",
        json={"workspace": "dev-box", "access_type": ACCESS_PAT, "access_key": owner_token},
        timeout=30,
    )
    assert anonymous.status_code == 401


def test_a_workspace_session_stands_for_its_hub_session(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    create(hub, ws, name="dev-box")
    signed = sign_in(hub, "developer", ws.setup.tokens["developer"])
    [row] = hub.db.rows("SELECT id, user_id FROM user_sessions")
    expires = int(time.time()) + 3600
    cookie = WorkspaceSession(int(row["user_id"]), int(row["id"]), expires).mint(hub.secret, time.time())
    assert authorize(hub, "dev-box", cookie, ACCESS_SESSION).status_code == 200

    forged = WorkspaceSession(int(row["user_id"]), int(row["id"]), expires).mint(os.urandom(32), time.time())
    someone_else = WorkspaceSession(ws.setup.user_ids["maintainer"], int(row["id"]), expires).mint(
        hub.secret, 0 + time.time()
    )
    for value in (forged, someone_else, "not-a-jwt"):
        assert authorize(hub, "dev-box", value, ACCESS_SESSION).status_code == 401

    with httpx.Client(base_url=hub.url, timeout=30) as browser:
        out = browser.post("/users/sign_out", headers={**signed.headers, "X-Csrf-Token": signed.csrf_token})
    assert out.status_code == 200
    answer = authorize(hub, "dev-box", cookie, ACCESS_SESSION)
    assert answer.status_code == 401 and "sign in again" in answer.text


def test_the_sign_in_for_workspaces_goes_back_to_the_callback_with_a_code(hub: RealHub) -> None:
    ws = workspace_setup(hub, RD_CONFIG)
    asked = AuthorizeRequest(CALLBACK, "/index.html?folder=x", nonce_digest("nonce"))
    start = f"{HUB_SIGN_IN_PATH}?request={asked.mint(hub.secret)}"
    with httpx.Client(base_url=hub.url, timeout=30, follow_redirects=False) as browser:
        to_form = browser.get(start)
        assert to_form.status_code == 303
        assert to_form.headers["location"].startswith("/users/sign_in?redirect_to=")
        form = browser.get(to_form.headers["location"])
        assert form.status_code == 200 and 'name="redirect_to"' in form.text
        target = parse_qs(urlsplit(to_form.headers["location"]).query)["redirect_to"][0]
        signed = browser.post(
            "/users/sign_in", data={"login": "developer", "token": ws.setup.tokens["developer"], "redirect_to": target}
        )
        assert signed.status_code == 303 and signed.headers["location"] == target
        back = browser.get(target)
        assert back.status_code == 302
        location = back.headers["location"]
        assert location.startswith(CALLBACK + "?code=")
        code = SignInCode.read(parse_qs(urlsplit(location).query)["code"][0], hub.secret)
        [row] = hub.db.rows("SELECT id FROM user_sessions")
        assert (code.user_id, code.session_id, code.request) == (ws.setup.user_ids["developer"], row["id"], asked)
        assert code.session_expires_at > time.time()
        # Signed in already: straight back, and the sign-in form itself goes on to a local path.
        assert browser.get(start).status_code == 302
        assert browser.get("/users/sign_in?redirect_to=/workspaces").headers["location"] == "/workspaces"


@pytest.mark.parametrize(
    "request_token",
    ["", "garbage", AuthorizeRequest(CALLBACK, "/", nonce_digest("n")).mint(os.urandom(32))],
)
def test_a_sign_in_request_kas_did_not_sign_is_refused(hub: RealHub, request_token: str) -> None:
    with httpx.Client(base_url=hub.url, timeout=30, follow_redirects=False) as browser:
        answer = browser.get(HUB_SIGN_IN_PATH, params={"request": request_token} if request_token else {})
    assert answer.status_code == 400 and "invalid or has expired" in answer.text


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:x"])
def test_the_sign_in_never_redirects_off_the_hub(hub: RealHub, target: str) -> None:
    _, token = hub.user("someone")
    with httpx.Client(base_url=hub.url, timeout=30, follow_redirects=False) as browser:
        form = browser.get("/users/sign_in", params={"redirect_to": target})
        assert form.status_code == 200 and "redirect_to" not in form.text
        signed = browser.post("/users/sign_in", data={"login": "someone", "token": token, "redirect_to": target})
        assert signed.status_code == 200 and "location" not in signed.headers
        again = browser.get("/users/sign_in", params={"redirect_to": target})
        assert again.status_code == 200 and "location" not in again.headers
