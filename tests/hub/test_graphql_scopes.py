"""Token scopes on ``/api/graphql`` (issue 27 item 4): GitLab's rules, over every scope and every operation.

A query needs ``api`` or ``read_api``, a mutation ``api``. A ``k8s_proxy``-only token used to read workspace
names and devfiles here while REST refused it with 403. The table covers every scope the hub knows and every
root field of the schema (a new field without a row fails the test); a refusal names the missing scope and
changes nothing. The console's browser session keeps creating and changing workspaces.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.console.test_console_bad_input import browser_for
from tests.fixtures.hub import RealHub
from tests.hub.workspace_helpers import DEVFILE, WorkspaceSetup, create, graphql, workspace_setup
from tether.hub.api.graphql import schema
from tether.hub.service.principal import SCOPES

#: Every root field, how to call it, and whether it reads or writes.
OPERATIONS: dict[str, tuple[str, str]] = {
    "Query.workspaces": ("read", "query { workspaces { nodes { name devfile } } }"),
    "Query.workspace": ("read", "query($id: ID!) { workspace(id: $id) { name devfile } }"),
    "Mutation.workspaceCreate": (
        "write",
        "mutation($input: WorkspaceCreateInput!) { workspaceCreate(input: $input) { errors workspace { name } } }",
    ),
    "Mutation.workspaceUpdate": (
        "write",
        'mutation($id: ID!) { workspaceUpdate(input: {id: $id, desiredState: "Stopped"}) { errors } }',
    ),
}
#: Every combination of the scopes the hub knows.
SCOPE_SETS = [
    frozenset(combination)
    for size in range(1, len(SCOPES) + 1)
    for combination in itertools.combinations(sorted(SCOPES), size)
]


def allowed(kind: str, scopes: frozenset[str]) -> bool:
    """GitLab's rule."""
    return "api" in scopes or (kind == "read" and "read_api" in scopes)


def test_the_table_covers_every_root_field() -> None:
    fields = {f"Query.{name}" for name in schema._schema.query_type.fields}  # type: ignore[union-attr]
    mutation = schema._schema.mutation_type
    assert mutation is not None
    fields |= {f"Mutation.{name}" for name in mutation.fields}
    assert schema._schema.subscription_type is None
    assert fields == set(OPERATIONS)


def _variables(ws: WorkspaceSetup, existing: dict[str, Any]) -> dict[str, Any]:
    return {"id": existing["id"], "input": ws.create_input(name=None)}


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_every_scope_on_every_operation(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    existing = create(hub, ws)
    user_id = ws.setup.user_ids["developer"]
    failures = []
    for scopes in SCOPE_SETS:
        token = hub.token_for(user_id, tuple(sorted(scopes)))
        for field, (kind, query) in OPERATIONS.items():
            before = hub.db.rows("SELECT id, desired_state FROM workspaces ORDER BY id")
            body = graphql(hub, token, query, _variables(ws, existing)).json()
            after = hub.db.rows("SELECT id, desired_state FROM workspaces ORDER BY id")
            case = f"{field} with {sorted(scopes)}"
            if allowed(kind, scopes):
                if body.get("errors"):
                    failures.append(f"{case}: refused: {body['errors']}")
                if kind == "read" and "schemaVersion" not in str(body.get("data")):
                    failures.append(f"{case}: no devfile read: {body}")
                if kind == "write":  # put things back for the next case
                    hub.db.execute("DELETE FROM workspaces WHERE id != :id", id=int(existing["id"].rsplit("/", 1)[1]))
                    hub.db.execute("UPDATE workspaces SET desired_state = 'Running'")
                continue
            needed = "api" if kind == "write" else "api or read_api"
            errors = body.get("errors") or []
            if body.get("data") is not None or len(errors) != 1:
                failures.append(f"{case}: not refused: {body}")
            elif errors[0]["message"] != (
                f"insufficient_scope: a {'mutation' if kind == 'write' else 'query'} needs a token with the "
                f"{needed} scope (this token has: {', '.join(sorted(scopes))})"
            ):
                failures.append(f"{case}: {errors[0]['message']!r}")
            elif errors[0]["extensions"] != {"code": "insufficient_scope", "required_scopes": needed.split(" or ")}:
                failures.append(f"{case}: {errors[0]['extensions']}")
            if after != before:
                failures.append(f"{case}: changed workspaces: {before} -> {after}")
    assert failures == []


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_a_k8s_proxy_token_learns_nothing(hub: RealHub) -> None:
    """Not even the schema, a ``__typename`` or the budget's verdict on its query."""
    ws = workspace_setup(hub)
    token = hub.token_for(ws.setup.user_ids["developer"], ("k8s_proxy",))
    for query in (
        "query { __typename }",
        "query { __schema { types { name } } }",
        "query { workspaces(first: 5000) { count } }",
        "query { nope }",
    ):
        body = graphql(hub, token, query).json()
        assert body["data"] is None and len(body["errors"]) == 1, body
        assert body["errors"][0]["extensions"]["code"] == "insufficient_scope", body


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_the_consoles_session_creates_and_changes_workspaces(hub: RealHub) -> None:
    """The console calls the same operations with the browser session (no token, so no scope to check)."""
    ws = workspace_setup(hub)
    browser, csrf = browser_for(hub, "developer", ws.setup.tokens["developer"])
    form = {
        "agent": str(ws.setup.agent_id),
        "project": str(ws.setup.project_id),
        "desired_state": "Running",
        "devfile": DEVFILE,
        "name": "from-console",
        "authenticity_token": csrf,
    }
    created = browser.post("/workspaces", data=form)
    assert created.status_code == 303, created.text
    workspace_id = hub.db.rows("SELECT id FROM workspaces WHERE name = 'from-console'")[0]["id"]
    stopped = browser.post(
        f"/workspaces/{workspace_id}/state", data={"desired_state": "Stopped", "authenticity_token": csrf}
    )
    assert stopped.status_code == 303, stopped.text
    assert hub.db.rows("SELECT desired_state FROM workspaces") == [{"desired_state": "Stopped"}]
