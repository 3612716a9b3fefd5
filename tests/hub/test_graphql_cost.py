"""What one GraphQL request may cost the hub (issue 27 item 3; item 9 "hub-side limits have no test").

Against the real hub on each backend: a request beyond the budget (top-level fields, aliases, workspaces
returned, devfiles returned, page size, depth, tokens) gets a GraphQL error naming the limit before anything runs
(not one database transaction begins), a body over 1 MiB gets 413, and the aliased fields of a request share one
transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from tests.fixtures.hub import RealHub
from tests.hub.workspace_helpers import bulk_create, graphql, workspace_setup
from tether.hub.api.graphql import MAX_BODY_BYTES
from tether.hub.db.engine import Database

NODES = "{ count nodes { id name } }"


def hub_database(hub: RealHub) -> Database:
    """The Database object of the hub serving in this process (its users' engine is ``engine``)."""
    server = hub.server._server
    assert server is not None
    db: Database = server.config.app.state.hub.db
    return db


@contextmanager
def transactions(hub: RealHub) -> Iterator[list[str]]:
    """Every transaction begun on the hub's user pool while the block runs (one entry each)."""
    begun: list[str] = []
    lock = threading.Lock()

    def on_begin(_connection: Any) -> None:
        with lock:
            begun.append("begin")

    engine = hub_database(hub).engine.sync_engine
    event.listen(engine, "begin", on_begin)
    try:
        yield begun
    finally:
        event.remove(engine, "begin", on_begin)


def refused(response: httpx.Response, words: str) -> None:
    """``response`` is a GraphQL refusal (no data) whose error names ``words``."""
    assert response.status_code == 200, response.text
    body = response.json()
    assert body.get("data") is None, body
    messages = [error["message"] for error in body["errors"]]
    assert any(words in message for message in messages), messages


def aliases(count: int, first: int = 100, fields: str = NODES) -> str:
    return "query { " + " ".join(f"a{i}: workspaces(first: {first}) {fields}" for i in range(count)) + " }"


@pytest.fixture
def developer(hub: RealHub) -> str:
    """A developer's token; the developer owns 30 workspaces."""
    ws = workspace_setup(hub)
    bulk_create(hub, ws.setup, ws.setup.agent_id, 30, "many")
    return ws.setup.tokens["developer"]


@pytest.mark.parametrize(
    ("query", "variables", "words"),
    [
        (aliases(11, first=10), None, "11 top-level fields; at most 10"),
        (aliases(2, first=600), None, "1200 workspaces returned"),
        ("query { workspaces(first: 1001) { count } }", None, "workspaces(first: 1001): first must be between 1"),
        ("query { workspaces(first: 0) { count } }", None, "workspaces(first: 0): first must be between 1"),
        ("query($n: Int) { workspaces(first: $n) { count } }", {"n": 5000}, "workspaces(first: 5000)"),
        ("query($n: Int = 2000) { workspaces(first: $n) { count } }", None, "workspaces(first: 2000)"),
        ("query { workspaces(first: 101) { nodes { devfile } } }", None, "101 devfiles returned"),
        (
            "query { ...A } fragment A on Query { a: workspaces(first: 600) { count } b: workspaces(first: 600) "
            "{ count } }",
            None,
            "1200 workspaces returned",
        ),
        (
            "query { workspaces { nodes { ...N } } } fragment N on Workspace { "
            + " ".join(f"f{i}: name" for i in range(21))
            + " }",
            None,
            "21 aliases; at most 20",
        ),
    ],
    ids=[
        "root-fields",
        "nodes",
        "page",
        "page-zero",
        "page-variable",
        "page-default",
        "devfiles",
        "fragment",
        "aliases",
    ],
)
def test_over_budget_is_refused_before_anything_runs(
    hub: RealHub, developer: str, query: str, variables: dict[str, Any] | None, words: str
) -> None:
    with transactions(hub) as begun:
        response = graphql(hub, developer, query, variables)
    refused(response, words)
    assert response.json()["errors"][0]["extensions"]["code"] == "query_too_expensive"
    assert len(begun) == 1, "only the token was looked up: no resolver ran"  # authentication's own transaction


def test_within_budget_is_answered(hub: RealHub, developer: str) -> None:
    """The budget's edges are allowed: 10 root fields, 1,000 workspaces, 100 devfiles, first 1..1000."""
    body = graphql(hub, developer, aliases(10)).json()
    assert body.get("errors") is None, body
    assert [body["data"][f"a{i}"]["count"] for i in range(10)] == [30] * 10
    body = graphql(hub, developer, "query { workspaces(first: 1000) { count } }").json()
    assert body["data"]["workspaces"]["count"] == 30
    body = graphql(hub, developer, "query { workspaces(first: 100) { nodes { devfile } } }").json()
    assert (
        len(body["data"]["workspaces"]["nodes"]) == 30
        and "schemaVersion" in body["data"]["workspaces"]["nodes"][0]["devfile"]
    )


def test_a_list_without_devfiles_then_one_workspace(hub: RealHub, developer: str) -> None:
    """The fields of a request share one session: ``workspace`` gets the row ``workspaces`` loaded without its
    devfile, and must not read the deferred column (it raised and the field came back as an internal error)."""
    first = graphql(hub, developer, "query { workspaces(first: 1) { nodes { id } } }").json()
    gid = first["data"]["workspaces"]["nodes"][0]["id"]
    query = "query($id: ID!) { workspaces(first: 100) { nodes { name } } workspace(id: $id) { id name } }"
    body = graphql(hub, developer, query, {"id": gid}).json()
    assert body.get("errors") is None, body
    assert body["data"]["workspace"]["id"] == gid


def test_aliased_fields_share_one_transaction(hub: RealHub, developer: str) -> None:
    """Each aliased field used to open its own transaction: 280 aliases held the pool (issue 27 item 3)."""
    with transactions(hub) as begun:
        body = graphql(hub, developer, aliases(10)).json()
    assert body.get("errors") is None, body
    assert len(begun) == 2, f"{len(begun)} transactions: one for the token, one for all ten fields"


def test_nested_fragments_are_reckoned_once(hub: RealHub, developer: str) -> None:
    """Fragments spreading each other twice, 40 deep, would be 2**40 fields if each spread were walked.

    Strawberry's depth limiter, used before, walked them so: the request below kept the hub busy for hours.
    """
    fragments = " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(40))
    query = "query { ...F0 } " + fragments + " fragment F40 on Query { w: workspaces(first: 1) { count } }"
    refused(graphql(hub, developer, query), "aliases; at most 20")
    cyclic = "query { ...A } fragment A on Query { ...B } fragment B on Query { ...A }"
    refused(graphql(hub, developer, cyclic), "Cannot spread fragment 'A' within itself")


def test_depth_limit(hub: RealHub, developer: str) -> None:
    """The schema is shallow; introspection is not: 9 levels are refused, 8 answered."""

    def nested(levels: int) -> str:
        inner = "name"
        for _ in range(levels - 3):
            inner = f"ofType {{ {inner} }}"
        return f"query {{ __schema {{ types {{ {inner} }} }} }}"

    refused(graphql(hub, developer, nested(9)), "9 levels of nested fields; at most 8")
    body = graphql(hub, developer, nested(8)).json()
    assert body.get("errors") is None, body


def test_token_limit(hub: RealHub, developer: str) -> None:
    """More than 4,000 tokens are refused while parsing; 4,000 are answered."""

    def states(count: int) -> str:  # 12 tokens, the start and the end of the document, and ``count`` strings
        return "query { workspaces(actualStates: [" + '"Running" ' * count + "]) { count } }"

    refused(graphql(hub, developer, states(3988)), "Document contains more than 4000 tokens")
    body = graphql(hub, developer, states(3987)).json()
    assert body.get("errors") is None, body


def test_body_size_limit(hub: RealHub, developer: str) -> None:
    """The body is read, at most 1 MiB of it, only once the token is known; then parsed."""
    url, headers = hub.url + "/api/graphql", {"PRIVATE-TOKEN": developer, "Content-Type": "application/json"}

    def body(padding: int) -> bytes:
        return b'{"query": "query { workspaces { count } }' + b" " * padding + b'"}'

    fits = httpx.post(url, content=body(MAX_BODY_BYTES - 60), headers=headers, timeout=30)
    assert fits.status_code == 200 and fits.json()["data"]["workspaces"]["count"] == 30, fits.text
    too_large = {"message": f"413 Request Entity Too Large - a GraphQL request is at most {MAX_BODY_BYTES} bytes"}
    declared = httpx.post(url, content=body(MAX_BODY_BYTES), headers=headers, timeout=30)
    assert (declared.status_code, declared.json()) == (413, too_large)
    chunked = httpx.post(url, content=iter([body(MAX_BODY_BYTES)]), headers=headers, timeout=30)
    assert "content-length" not in chunked.request.headers
    assert (chunked.status_code, chunked.json()) == (413, too_large)
    anonymous = httpx.post(url, content=body(MAX_BODY_BYTES), headers={"Content-Type": "application/json"}, timeout=30)
    assert anonymous.status_code == 401
