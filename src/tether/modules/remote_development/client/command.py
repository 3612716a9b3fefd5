"""``tether workspace ...``: a user's command line for workspaces, over the hub's GraphQL API.

The hub URL comes from ``--hub`` or ``TETHER_HUB_URL``, the personal access token from ``--token`` or
``TETHER_PAT``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..states import ACTUAL_STATES, State

GID = "gid://gitlab/RemoteDevelopment::Workspace/"
_FIELDS = (
    "id name namespace desiredState actualState actualStateMessage actualStateUpdatedAt url "
    "clusterAgent { id name } projectId user { username } createdAt"
)
_TIMEOUT_S = 30.0
#: GitLab's wording for a workspace that does not exist or is someone else's; ``show`` and every change use it.
NOT_FOUND = "does not exist or you don't have permission to perform this action"
#: Seconds between two reads of a workspace's state while ``--wait`` follows it.
_POLL_S = 1.0
#: Actual states that end a ``--wait`` without reaching the desired state (seed 003 "Workspace states").
_FAILED_STATES = frozenset({State.FAILED, State.ERROR})
#: How long a failure the workspace was already in when ``--wait`` began may last before it ends the wait: it
#: predates the request, and the next partial reconciliation (10 s by default) may clear it (an Error is
#: retried at every one, a Failed pod may start).
_STALE_FAILURE_S = 30.0


class Hub:
    """A GraphQL client for one hub URL and token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/") + "/api/graphql"
        self.token = token

    def call(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        """Run ``query``; returns ``data``.

        Raises:
            click.ClickException: the hub cannot be reached, refuses the token, or answers with errors.
        """
        request = urllib.request.Request(
            self.url,
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json", "PRIVATE-TOKEN": self.token},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code == 401:
                raise click.ClickException("the hub refused the token (401): check --token / TETHER_PAT") from exc
            raise click.ClickException(f"the hub answered {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise click.ClickException(f"cannot reach the hub at {self.url}: {exc}") from exc
        if body.get("errors"):
            raise click.ClickException("; ".join(str(e.get("message")) for e in body["errors"]))
        return dict(body["data"])


class Options:
    """The group's options, checked when a command needs the hub (so ``--help`` works without them)."""

    def __init__(self, hub_url: str | None, token: str | None) -> None:
        self.hub_url = hub_url
        self.token = token

    def hub(self) -> Hub:
        """A client for the hub.

        Raises:
            click.UsageError: no hub URL or token; click.BadParameter: not an http(s) URL.
        """
        if not self.hub_url:
            raise click.UsageError("give the hub URL with --hub or TETHER_HUB_URL")
        if not self.hub_url.startswith(("http://", "https://")):
            raise click.BadParameter("must start with http:// or https://", param_hint="--hub")
        if not self.token:
            raise click.UsageError("give a personal access token with --token or TETHER_PAT")
        return Hub(self.hub_url, self.token)


def _gid(ref: str) -> str:
    return ref if ref.startswith("gid://") else GID + ref


def _show(workspace: dict[str, Any], output: str) -> None:
    if output == "json":
        click.echo(json.dumps(workspace, indent=2))
        return
    for key in ("name", "namespace", "desiredState", "actualState", "actualStateMessage", "url"):
        click.echo(f"{key + ':':22s}{workspace.get(key) or ''}")
    click.echo(f"{'id:':22s}{workspace['id'].removeprefix(GID)}")
    click.echo(f"{'agent:':22s}{workspace['clusterAgent']['name']}")


def _payload(data: dict[str, Any], mutation: str) -> dict[str, Any]:
    payload = data[mutation]
    if payload["errors"]:
        raise click.ClickException("; ".join(payload["errors"]))
    return dict(payload["workspace"])


@click.group("workspace")
@click.option("--hub", "hub_url", envvar="TETHER_HUB_URL", help="Hub URL, e.g. http://127.0.0.1:8080 [TETHER_HUB_URL].")
@click.option("--token", envvar="TETHER_PAT", help="Personal access token with the api scope [TETHER_PAT].")
@click.pass_context
def workspace_command(ctx: click.Context, hub_url: str | None, token: str | None) -> None:
    """Create, list, start, stop, restart and terminate your workspaces (seed 003)."""
    ctx.obj = Options(hub_url, token)


def _call_on(options: Options, workspace_id: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    """Run ``query`` about one workspace; a not-found refusal is worded as ``show`` words it.

    Raises:
        click.ClickException: as :meth:`Hub.call`; "workspace N does not exist or ..." for a workspace that does
            not exist or is someone else's (the hub does not tell the two apart, GitLab's rule).
    """
    try:
        return options.hub().call(query, variables)
    except click.ClickException as exc:
        if NOT_FOUND in exc.message:
            raise click.ClickException(f"workspace {workspace_id} {NOT_FOUND}") from exc
        raise


def _target(desired: str) -> str:
    """The actual state a ``--wait`` waits for: a restart ends Running (seed 003 "Workspace states")."""
    return State.RUNNING.value if desired == State.RESTART_REQUESTED else desired


def _wait(options: Options, workspace: dict[str, Any], timeout_s: float) -> None:
    """Print each actual state change of ``workspace`` until it reaches its desired state.

    A restart is reached once the hub has flipped ``RestartRequested`` back to ``Running`` (agentk reported
    ``Stopped``) and the workspace runs again; until then its states are those of before the restart. A failure
    the workspace was already in when the wait began ends it only after :data:`_STALE_FAILURE_S` seconds.

    Raises:
        click.ClickException: the workspace failed (its reason is printed), vanished, or ``timeout_s`` seconds
            passed first.
    """
    target = _target(workspace["desiredState"])
    ref = workspace["id"].removeprefix(GID)
    query = f"query($id: ID!) {{ workspace(id: $id) {{ {_FIELDS} }} }}"
    started = time.monotonic()
    deadline = started + timeout_s
    initial = (workspace["actualState"], workspace.get("actualStateMessage") or "")
    seen: tuple[str, str] | None = None
    while True:
        state = workspace["actualState"]
        reason = workspace.get("actualStateMessage") or ""
        if (state, reason) != seen:
            seen = (state, reason)
            click.echo(f"{workspace['name']}: {state}" + (f" ({reason})" if reason else ""))
        restarting = workspace["desiredState"] == State.RESTART_REQUESTED
        if state == target and not restarting:
            return
        stale = (state, reason) == initial and time.monotonic() - started < _STALE_FAILURE_S
        if state in _FAILED_STATES and not restarting and not stale:
            raise click.ClickException(f"{workspace['name']} is {state}, not {target}: {reason or 'no reason given'}")
        if time.monotonic() >= deadline:
            raise click.ClickException(
                f"{workspace['name']} is still {state} after {timeout_s:g} s (waiting for {target})"
                + (f": {reason}" if reason else "")
            )
        time.sleep(_POLL_S)
        found = _call_on(options, ref, query, {"id": workspace["id"]})["workspace"]
        if found is None:
            raise click.ClickException(f"workspace {ref} {NOT_FOUND}")
        workspace = found


def _wait_options(command: Any) -> Any:
    """``--wait`` and ``--timeout``, shared by create and the state changes."""
    command = click.option(
        "--timeout",
        "timeout_s",
        type=click.FloatRange(min=1),
        default=600.0,
        show_default=True,
        help="Seconds --wait waits before it gives up (the workspace keeps going).",
    )(command)
    return click.option(
        "--wait",
        is_flag=True,
        help="Print the state changes until the desired state is reached; exit 1 with the reason if it fails.",
    )(command)


@workspace_command.command("create")
@click.option("--agent", "agent_id", type=int, required=True, help="Cluster agent id.")
@click.option("--project", "project_id", type=int, required=True, help="Project id.")
@click.option("--devfile", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Devfile (YAML).")
@click.option("--name", default=None, help="A DNS label (default: generated).")
@click.option("--ref", default="main", show_default=True, help="Branch or tag recorded with the workspace.")
@click.option("--stopped", is_flag=True, help="Create it stopped instead of running.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_wait_options
@click.pass_obj
def create(
    options: Options,
    agent_id: int,
    project_id: int,
    devfile: Path | None,
    name: str | None,
    ref: str,
    stopped: bool,
    output: str,
    wait: bool,
    timeout_s: float,
) -> None:
    """Ask for a new workspace; prints it (state CreationRequested until agentk reports)."""
    query = (
        f"mutation($i: WorkspaceCreateInput!) {{ workspaceCreate(input: $i) {{ errors workspace {{ {_FIELDS} }} }} }}"
    )
    variables = {
        "i": {
            "clusterAgentId": f"gid://gitlab/Clusters::Agent/{agent_id}",
            "projectId": f"gid://gitlab/Project/{project_id}",
            "desiredState": "Stopped" if stopped else "Running",
            "projectRef": ref,
            "devfile": devfile.read_text() if devfile else None,
            "devfilePath": devfile.name if devfile else None,
            "name": name,
        }
    }
    workspace = _payload(options.hub().call(query, variables), "workspaceCreate")
    _show(workspace, output)
    if wait:
        _wait(options, workspace, timeout_s)


def _canonical_states(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--state`` values in any case, named as the hub stores them.

    Raises:
        click.BadParameter: not an actual state (the message lists them); the filter would match nothing.
    """
    by_folded = {state.value.casefold(): state.value for state in ACTUAL_STATES}
    unknown = [value for value in values if value.casefold() not in by_folded]
    if unknown:
        raise click.BadParameter(f"{', '.join(map(repr, unknown))}: not one of {', '.join(sorted(by_folded.values()))}")
    return tuple(by_folded[value.casefold()] for value in values)


@workspace_command.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    callback=_canonical_states,
    help="Only these actual states, in any case (repeatable), e.g. running, failed.",
)
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def list_(options: Options, states: tuple[str, ...], output: str) -> None:
    """List your workspaces (all of them for an administrator), newest first."""
    query = f"query($s: [String!]) {{ workspaces(actualStates: $s, first: 1000) {{ nodes {{ {_FIELDS} }} }} }}"
    nodes = options.hub().call(query, {"s": list(states) or None})["workspaces"]["nodes"]
    if output == "json":
        click.echo(json.dumps(nodes, indent=2))
        return
    table = Table(title=f"{len(nodes)} workspaces", title_justify="left")
    # Ids and names are what a user copies into the next command: never cut or folded.
    for column in ("id", "name"):
        table.add_column(column, no_wrap=True, min_width=max((len(n[column]) for n in nodes), default=0))
    for column in ("agent", "desired", "actual", "reason"):
        table.add_column(column)
    for n in nodes:
        table.add_row(
            n["id"].removeprefix(GID),
            n["name"],
            n["clusterAgent"]["name"],
            n["desiredState"],
            n["actualState"],
            n["actualStateMessage"],
        )
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        # Piped: no terminal width to respect, so nothing is truncated to rich's 80-column default.
        console = Console(soft_wrap=True, width=10_000)
    console.print(table)


@workspace_command.command("show")
@click.argument("workspace_id")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def show(options: Options, workspace_id: str, output: str) -> None:
    """Show one workspace by id."""
    query = f"query($id: ID!) {{ workspace(id: $id) {{ {_FIELDS} }} }}"
    data = _call_on(options, workspace_id, query, {"id": _gid(workspace_id)})
    if data["workspace"] is None:
        raise click.ClickException(f"workspace {workspace_id} {NOT_FOUND}")
    _show(data["workspace"], output)


def _state_command(name: str, state: str, help_text: str) -> None:
    @workspace_command.command(name, help=help_text)
    @click.argument("workspace_id")
    @_wait_options
    @click.pass_obj
    def change(options: Options, workspace_id: str, wait: bool, timeout_s: float) -> None:
        query = (
            "mutation($id: ID!, $s: String!) { workspaceUpdate(input: {id: $id, desiredState: $s}) "
            f"{{ errors workspace {{ {_FIELDS} }} }} }}"
        )
        data = _call_on(options, workspace_id, query, {"id": _gid(workspace_id), "s": state})
        workspace = _payload(data, "workspaceUpdate")
        click.echo(f"{workspace['name']}: desired {workspace['desiredState']}, actual {workspace['actualState']}")
        if wait:
            _wait(options, workspace, timeout_s)


_state_command("start", "Running", "Start a stopped workspace (desired Running).")
_state_command("stop", "Stopped", "Stop a workspace; its data volume stays (desired Stopped).")
_state_command("restart", "RestartRequested", "Stop then start a workspace again (desired RestartRequested).")
_state_command("terminate", "Terminated", "Delete a workspace and its data for good (desired Terminated).")
