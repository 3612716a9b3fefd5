"""The console's audit page ``/-/audit`` (issue 25 item 1), against the real hub: who sees which events, the
filters and pages in a real Chromium, and what a curious user or a hostile event cannot do."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.console.browser import new_page, shot, sign_in
from tests.console.test_console_bad_input import browser_for
from tests.fixtures.hub import HubLauncher, RealHub
from tests.hub.audit_helpers import event, store
from tests.hub.helpers import Setup, project_with_agent


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[RealHub]:
    """One hub on SQLite (the page's queries are the REST API's, tested on both backends in tests/hub)."""
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    try:
        yield launcher.launch()
    finally:
        launcher.stop_all()


@pytest.fixture
def setup(hub: RealHub) -> Setup:
    return project_with_agent(hub, roles=("developer", "maintainer"))


def _event_ids(page_html: str) -> set[str]:
    return set(re.findall(r'data-event-id="([0-9a-f]{32})"', page_html))


def test_the_page_shows_a_user_only_what_they_may_read(hub: RealHub, setup: Setup) -> None:
    other_agent = hub.api().post("/projects", json={"name": "elsewhere"}).json()["id"]
    other_agent = hub.api().post(f"/projects/{other_agent}/cluster_agents", json={"name": "staging"}).json()["id"]
    users = setup.user_ids
    mine = event(setup.agent_id, user_id=users["developer"], username="developer")
    victims = event(other_agent, user_id=users["outsider"], username="outsider", namespace="secret-ns")
    hostile = event(setup.agent_id, name="<script>alert(1)</script>", path="/api/v1/<img src=x onerror=alert(1)>")
    store(hub, [mine, victims, hostile])

    developer, _csrf = browser_for(hub, "developer", setup.tokens["developer"])
    for params in ({}, {"user_id": users["outsider"]}, {"agent_id": other_agent}, {"namespace": "secret-ns"}):
        page = developer.get("/-/audit", params=params)
        assert page.status_code == 200, page.text
        assert victims["id"] not in page.text, params
        assert _event_ids(page.text) <= {mine["id"]}, params
    assert _event_ids(developer.get("/-/audit").text) == {mine["id"]}

    developer.close()

    maintainer, _csrf = browser_for(hub, "maintainer", setup.tokens["maintainer"])
    page = maintainer.get("/-/audit")
    assert _event_ids(page.text) == {mine["id"], hostile["id"]}
    assert "<script>alert(1)</script>" not in page.text and "&lt;script&gt;" in page.text
    assert "<img src=x" not in page.text
    bad = maintainer.get("/-/audit", params={"since": "last tuesday", "agent_id": "1"})
    assert bad.status_code == 400
    assert "since" in bad.text and "ISO 8601" in bad.text and _event_ids(bad.text) == set()
    assert maintainer.get("/-/audit", params={"agent_id": "x"}).status_code == 400
    maintainer.close()

    with httpx.Client(base_url=hub.url, timeout=30) as anonymous:
        answer = anonymous.get("/-/audit")
        assert (answer.status_code, answer.headers.get("location")) == (303, "/")


def test_the_audit_page_in_chromium(hub: RealHub, setup: Setup, browser: Browser) -> None:
    now = time.time()
    older = [event(setup.agent_id, verb="list", time=now - 600 - i) for i in range(55)]
    recorded = event(
        setup.agent_id,
        verb="exec",
        subresource="exec",
        name="web-0",
        user_id=setup.user_ids["developer"],
        username="developer",
        recording="complete",
        time=now,
    )
    cut_short = event(setup.agent_id, verb="attach", subresource="attach", recording="incomplete", time=now - 1)
    store(hub, [*older, recorded, cut_short])

    page = new_page(browser)
    sign_in(page, hub.url, "root", hub.admin_token)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Audit").click()
    page.wait_for_url("**/-/audit")
    rows = page.locator("#audit-table tbody tr")
    expect(rows).to_have_count(50)
    first = rows.first
    expect(first).to_have_attribute("data-event-id", recorded["id"])
    expect(first.get_by_role("link", name="Replay")).to_have_attribute("href", f"/-/audit/{recorded['id']}/recording")
    expect(rows.nth(1)).to_contain_text("incomplete")
    expect(page.get_by_text("Page 1 of 2")).to_be_visible()
    shot(page, "audit-list")

    page.get_by_role("link", name="Next").click()
    expect(rows).to_have_count(7)
    expect(page.get_by_text("Page 2 of 2")).to_be_visible()

    page.get_by_label("Verb").fill("exec")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("developer")
    expect(rows.first).to_contain_text("web-0")
    expect(page.get_by_label("Verb")).to_have_value("exec")
    shot(page, "audit-filtered")
    page.context.close()
