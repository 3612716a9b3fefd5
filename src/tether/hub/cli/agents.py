"""``tether hub agent ...``: register agents, manage their tokens and configuration."""

from __future__ import annotations

from pathlib import Path

import click
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.cli.common import err_console, in_transaction, print_secret, print_table, run
from tether.hub.cli.context import HubContext, pass_hub
from tether.hub.db.agents import ClusterAgent, ClusterAgentToken
from tether.hub.errors import NotFound
from tether.hub.service import agents
from tether.hub.service.paths import find_project
from tether.hub.service.principal import Principal
from tether.hub.workspaces.lost import mark_lost

#: Seconds ``token-revoke`` keeps trying to reach a kas before it leaves the token to kas' re-validation.
_CLI_DELIVERY_S = 60.0


async def _agent(session: AsyncSession, op: Principal, project_ref: str, name: str) -> ClusterAgent:
    project = await find_project(session, project_ref)
    agent = await session.scalar(
        select(ClusterAgent).where(ClusterAgent.project_id == project.id, ClusterAgent.name == name)
    )
    if agent is None:
        raise NotFound("Agent")
    return await agents.get_agent(session, op, project, agent.id)


@click.group("agent")
def agent_group() -> None:
    """Manage cluster agents."""


@agent_group.command("register")
@click.argument("project")
@click.argument("name")
@click.option("--token-name", default="default", show_default=True, help="Name of the agent's first token.")
@pass_hub
def agent_register(hub: HubContext, project: str, name: str, token_name: str) -> None:
    """Register agent NAME in PROJECT (full path or id) and print its first token once (alone on stdout)."""

    async def work(session: AsyncSession, op: Principal) -> tuple[int, str]:
        target = await find_project(session, project)
        agent = await agents.create_agent(session, op, target, name)
        _row, plain = await agents.create_token(session, op, agent, token_name)
        return agent.id, plain

    agent_id, plain = in_transaction(hub, work)
    err_console.print(f"agent {name} registered in {project} with id {agent_id}")
    print_secret(f"token of agent {name}", plain)


@agent_group.command("list")
@click.argument("project")
@pass_hub
def agent_list(hub: HubContext, project: str) -> None:
    """List the agents of PROJECT as a table."""

    async def work(session: AsyncSession, op: Principal) -> list[ClusterAgent]:
        target = await find_project(session, project)
        return list(await session.scalars(agents.agents_query(target)))

    rows = [(a.id, a.name, a.created_at) for a in in_transaction(hub, work)]
    print_table(f"agents of {project}", ["id", "name", "created"], rows)


@agent_group.command("token-create")
@click.argument("project")
@click.argument("name")
@click.option("--token-name", default="cli", show_default=True, help="Name of the new token.")
@pass_hub
def agent_token_create(hub: HubContext, project: str, name: str, token_name: str) -> None:
    """Create another token for agent NAME of PROJECT and print it once (alone on stdout)."""

    async def work(session: AsyncSession, op: Principal) -> str:
        _row, plain = await agents.create_token(session, op, await _agent(session, op, project, name), token_name)
        return plain

    print_secret(f"token of agent {name}", in_transaction(hub, work))


@agent_group.command("token-list")
@click.argument("project")
@click.argument("name")
@pass_hub
def agent_token_list(hub: HubContext, project: str, name: str) -> None:
    """List the active tokens of agent NAME of PROJECT (never the tokens themselves)."""

    async def work(session: AsyncSession, op: Principal) -> list[ClusterAgentToken]:
        return list(await session.scalars(agents.active_tokens_query(await _agent(session, op, project, name))))

    rows = [(t.id, t.name, t.created_at, t.last_used_at) for t in in_transaction(hub, work)]
    print_table(f"tokens of agent {name}", ["id", "name", "created", "last used"], rows)


@agent_group.command("token-revoke")
@click.argument("project")
@click.argument("name")
@click.argument("token_id", type=int)
@pass_hub
def agent_token_revoke(hub: HubContext, project: str, name: str, token_id: int) -> None:
    """Revoke token TOKEN_ID of agent NAME of PROJECT."""

    async def work(session: AsyncSession, op: Principal) -> tuple[int, str]:
        token = await agents.get_token(session, await _agent(session, op, project, name), token_id)
        agents.revoke_token(token)
        return token.agent_id, token.token_digest

    agent_id, digest = in_transaction(hub, work)
    click.echo(f"agent token {token_id} revoked")
    _tell_kas(hub, agent_id, digest)


def _tell_kas(hub: HubContext, agent_id: int, digest: str) -> None:
    """Deliver the revocation to kas as the server does (issue 27 item 6), waiting for at most a minute here.

    Without ``kas.api_address``, or if no kas acknowledges in time, every kas still refuses the token once its
    cached answer expires (``agent.info_cache_ttl``) and its next re-validation runs; the message says so.
    """
    from tether.hub.kas_client import client_for  # noqa: PLC0415 - grpc only for this command

    config = hub.config()
    later = "kas refuses it once its cached answer expires (agent.info_cache_ttl, 5 min by default)"
    if config.kas.api_address is None:
        click.echo(f"kas.api_address is not set: {later}", err=True)
        return

    async def deliver() -> bool:
        client = client_for(config)  # a grpc.aio channel belongs to the loop it is made in
        assert client is not None
        try:
            return await client.deliver_revocation(agent_id, [digest], config.kas.timeout, _CLI_DELIVERY_S)
        finally:
            await client.close()

    if run(deliver()):
        click.echo("kas acknowledged the revocation: every kas refuses the token now")
    else:
        click.echo(f"no kas acknowledged the revocation within {_CLI_DELIVERY_S:g} s: {later}", err=True)


@agent_group.command("config-set")
@click.argument("project")
@click.argument("name")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@pass_hub
def agent_config_set(hub: HubContext, project: str, name: str, file: Path) -> None:
    """Set the configuration of agent NAME of PROJECT from FILE (YAML, upstream config.yaml schema)."""
    content = file.read_text()

    async def work(session: AsyncSession, op: Principal) -> agents.ConfigurationView:
        return await agents.set_configuration(session, op, await _agent(session, op, project, name), content)

    view = in_transaction(hub, work)
    for warning in view.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"configuration of agent {name} is now version {view.version}")


@agent_group.command("config-show")
@click.argument("project")
@click.argument("name")
@pass_hub
def agent_config_show(hub: HubContext, project: str, name: str) -> None:
    """Print the configuration file of agent NAME of PROJECT."""

    async def work(session: AsyncSession, op: Principal) -> str:
        view = await agents.get_configuration(session, await _agent(session, op, project, name))
        return view.row.content if view.row is not None else ""

    click.echo(in_transaction(hub, work), nl=False)


@agent_group.command("workspaces-lost")
@click.argument("project")
@click.argument("name")
@click.option("--reason", required=True, help="Why the workspaces are gone; shown as their state's message.")
@pass_hub
def agent_workspaces_lost(hub: HubContext, project: str, name: str, reason: str) -> None:
    """Mark the workspaces of agent NAME of PROJECT Terminated because their cluster is gone (kept, not deleted).

    For a cluster replaced by a new, empty one (``tether up`` does this on every start): the workspaces
    would otherwise be listed Running and recreated with empty volumes. Prints the names it marked.
    """
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="--reason")

    async def work(session: AsyncSession, op: Principal) -> list[str]:
        return await mark_lost(session, (await _agent(session, op, project, name)).id, reason)

    for marked in in_transaction(hub, work):
        click.echo(marked)
