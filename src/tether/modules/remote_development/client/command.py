"""``tether workspace ...``: a user's command line for workspaces, over the hub's GraphQL API.

The hub URL comes from ``--hub`` or ``TETHER_HUB_URL``, the personal access token from ``--token`` or
``TETHER_PAT``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

GID = "gid://gitlab/RemoteDevelopment::Workspace/"
_FIELDS = (
    "id name namespace desiredState actualState actualStateMessage actualStateUpdatedAt url "
    "clusterAgent { id name } projectId user { username } createdAt"
)
_TIMEOUT_S = 30.0


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


@workspace_command.command("create")
@click.option("--agent", "agent_id", type=int, required=True, help="Cluster agent id.")
@click.option("--project", "project_id", type=int, required=True, help="Project id.")
@click.option("--devfile", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Devfile (YAML).")
@click.option("--name", default=None, help="A DNS label (default: generated).")
@click.option("--ref", default="main", show_default=True, help="Branch or tag recorded with the workspace.")
@click.option("--stopped", is_flag=True, help="Create it stopped instead of running.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
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
    _show(_payload(options.hub().call(query, variables), "workspaceCreate"), output)


@workspace_command.command("list")
@click.option("--state", "states", multiple=True, help="Only these actual states (repeatable).")
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
    for column in ("id", "name", "agent", "desired", "actual", "reason"):
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
    Console(soft_wrap=True).print(table)


@workspace_command.command("show")
@click.argument("workspace_id")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def show(options: Options, workspace_id: str, output: str) -> None:
    """Show one workspace by id."""
    data = options.hub().call(f"query($id: ID!) {{ workspace(id: $id) {{ {_FIELDS} }} }}", {"id": _gid(workspace_id)})
    if data["workspace"] is None:
        raise click.ClickException(f"workspace {workspace_id} not found (or not yours)")
    _show(data["workspace"], output)


def _state_command(name: str, state: str, help_text: str) -> None:
    @workspace_command.command(name, help=help_text)
    @click.argument("workspace_id")
    @click.pass_obj
    def change(options: Options, workspace_id: str) -> None:
        query = (
            "mutation($id: ID!, $s: String!) { workspaceUpdate(input: {id: $id, desiredState: $s}) "
            f"{{ errors workspace {{ {_FIELDS} }} }} }}"
        )
        workspace = _payload(options.hub().call(query, {"id": _gid(workspace_id), "s": state}), "workspaceUpdate")
        click.echo(f"{workspace['name']}: desired {workspace['desiredState']}, actual {workspace['actualState']}")


_state_command("start", "Running", "Start a stopped workspace (desired Running).")
_state_command("stop", "Stopped", "Stop a workspace; its data volume stays (desired Stopped).")
_state_command("restart", "RestartRequested", "Stop then start a workspace again (desired RestartRequested).")
_state_command("terminate", "Terminated", "Delete a workspace and its data for good (desired Terminated).")
