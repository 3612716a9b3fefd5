"""Building blocks for hub tests: a project with an agent, people in each role, and browser sign-in."""

from __future__ import annotations

from dataclasses import dataclass
from http.cookies import SimpleCookie

import httpx

from tests.fixtures.hub import RealHub


@dataclass
class Setup:
    """``platform/clusters`` with agent ``production`` and a user per role (tokens with scope ``api``)."""

    project_id: int
    agent_id: int
    tokens: dict[str, str]
    user_ids: dict[str, int]


ROLE_LEVELS = {"guest": 10, "reporter": 20, "developer": 30, "maintainer": 40}


def project_with_agent(hub: RealHub, roles: tuple[str, ...] = tuple(ROLE_LEVELS)) -> Setup:
    admin = hub.api()
    group = admin.post("/groups", json={"name": "Platform", "path": "platform"})
    assert group.status_code == 201, group.text
    project = admin.post("/projects", json={"name": "clusters", "namespace_id": group.json()["id"]})
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    agent = admin.post(f"/projects/{project_id}/cluster_agents", json={"name": "production"})
    assert agent.status_code == 201, agent.text
    tokens: dict[str, str] = {}
    user_ids: dict[str, int] = {}
    for role in roles:
        user_id, token = hub.user(role)
        response = admin.post(
            f"/projects/{project_id}/members", json={"user_id": user_id, "access_level": ROLE_LEVELS[role]}
        )
        assert response.status_code == 201, response.text
        tokens[role], user_ids[role] = token, user_id
    user_ids["outsider"], tokens["outsider"] = hub.user("outsider")
    return Setup(project_id, agent.json()["id"], tokens, user_ids)


def kas_config(hub: RealHub, setup: Setup, yaml_text: str) -> None:
    response = hub.api().put(
        f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration", content=yaml_text.encode()
    )
    assert response.status_code == 200, response.text


@dataclass
class SignedIn:
    """A browser session made by ``POST /users/sign_in``: the two cookies' values and the CSRF token."""

    session_cookie: str
    kas_cookie: str
    csrf_token: str
    cookies: dict[str, SimpleCookie]

    @property
    def headers(self) -> dict[str, str]:
        """What a browser sends the hub: the ``_gitlab_session`` cookie."""
        return {"Cookie": f"_gitlab_session={self.session_cookie}"}


def set_cookies(response: httpx.Response) -> dict[str, SimpleCookie]:
    """Each ``Set-Cookie`` header of ``response``, parsed, by cookie name."""
    parsed: dict[str, SimpleCookie] = {}
    for header in response.headers.get_list("set-cookie"):
        cookie: SimpleCookie = SimpleCookie()
        cookie.load(header)
        for name in cookie:
            parsed[name] = cookie
    return parsed


def post_sign_in(hub: RealHub, login: str, token: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """``POST /users/sign_in`` with the form fields ``login`` and ``token``."""
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        return client.post("/users/sign_in", data={"login": login, "token": token}, headers=headers or {})


def sign_in(hub: RealHub, login: str, token: str) -> SignedIn:
    """Sign in and return the session; the CSRF token is read from ``GET /users/session``."""
    response = post_sign_in(hub, login, token)
    assert response.status_code == 200, response.text
    cookies = set_cookies(response)
    session_cookie = cookies["_gitlab_session"]["_gitlab_session"].value
    kas_cookie = cookies["_gitlab_kas"]["_gitlab_kas"].value
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        session = client.get("/users/session", headers={"Cookie": f"_gitlab_session={session_cookie}"})
    assert session.status_code == 200, session.text
    return SignedIn(session_cookie, kas_cookie, str(session.json()["csrf_token"]), cookies)
