"""GitLab takes parameters form-encoded as well as in JSON; so does the hub (``curl --data "name=prod"``)."""

from __future__ import annotations

from tests.fixtures.hub import RealHub


def test_form_and_untyped_json_bodies(hub: RealHub) -> None:
    api = hub.api()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    project = api.post("/projects", content=b"name=forms&description=made+by+curl", headers=form)
    assert project.status_code == 201 and project.json()["description"] == "made by curl"
    agents = f"/projects/{project.json()['id']}/cluster_agents"
    assert api.post(agents, content=b'{"name": "untyped"}').status_code == 201  # no content type
    assert api.post(agents, content=b'{"name": "curl-json"}', headers=form).status_code == 201
    assert api.post(agents, content=b"name=curl-form", headers=form).status_code == 201
    user_id, _ = hub.user("erin")
    token = api.post(
        f"/users/{user_id}/personal_access_tokens",
        content=b"name=ci&scopes[]=api&scopes[]=read_api&expires_at=2099-12-31",
        headers=form,
    )
    assert token.status_code == 201 and token.json()["scopes"] == ["api", "read_api"]
    member = api.post(
        f"/projects/{project.json()['id']}/members", content=f"user_id={user_id}&access_level=30".encode(), headers=form
    )
    assert member.status_code == 201 and member.json()["access_level"] == 30
    refused = api.post(agents, content=b"name=x&bogus=1", headers=form)
    assert refused.status_code == 400 and "bogus" in refused.json()["error"]
    names = [a["name"] for a in api.get(agents).json()]
    assert names == ["untyped", "curl-json", "curl-form"]

    # The configuration endpoint takes the YAML as it is, whatever curl claims the content type is.
    config = api.put(f"{agents}/1/configuration", content=b"observability:\n  logging: {level: warn}\n", headers=form)
    assert config.status_code == 200 and config.json()["configuration"] == {
        "observability": {"logging": {"level": "warn"}}
    }
