"""``tether hub group ...``, ``tether hub project ...`` and ``tether hub member ...``."""

from __future__ import annotations

import click
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.cli.common import in_transaction, print_table
from tether.hub.cli.context import HubContext, pass_hub
from tether.hub.db.namespaces import Namespace, Project
from tether.hub.roles import parse_role
from tether.hub.service import groups, members, projects
from tether.hub.service.paths import find_group, find_project
from tether.hub.service.principal import Principal
from tether.tool.ids import is_ascii_number


def _split(full_path: str) -> tuple[str | None, str]:
    parent, _, path = full_path.strip("/").rpartition("/")
    return (parent or None), path


@click.group("group")
def group_group() -> None:
    """Manage groups."""


@group_group.command("create")
@click.argument("full_path")
@click.option("--name", default=None, help="Display name (default: the last path segment).")
@click.option("--owner", default=None, help="Username to make the group's Owner.")
@pass_hub
def group_create(hub: HubContext, full_path: str, name: str | None, owner: str | None) -> None:
    """Create the group FULL_PATH (e.g. `platform` or `platform/team`; the parent must exist)."""
    parent, path = _split(full_path)

    async def work(session: AsyncSession, op: Principal) -> int:
        group = await groups.create_group(session, op, name or path, path, parent)
        if owner:
            await members.add_group_member(session, op, group, owner, 50)
        return group.id

    click.echo(f"group {full_path} created with id {in_transaction(hub, work)}")


@group_group.command("list")
@pass_hub
def group_list(hub: HubContext) -> None:
    """List groups as a table."""

    async def work(session: AsyncSession, op: Principal) -> list[Namespace]:
        return list(await session.scalars(groups.visible_groups_query(op)))

    print_table("groups", ["id", "full path", "name"], [(g.id, g.full_path, g.name) for g in in_transaction(hub, work)])


@click.group("project")
def project_group() -> None:
    """Manage projects."""


@project_group.command("create")
@click.argument("full_path")
@click.option("--name", default=None, help="Display name (default: the last path segment).")
@click.option("--maintainer", default=None, help="Username to make the project's Maintainer.")
@pass_hub
def project_create(hub: HubContext, full_path: str, name: str | None, maintainer: str | None) -> None:
    """Create the project FULL_PATH in an existing group or user namespace (e.g. `platform/clusters`)."""
    namespace, path = _split(full_path)
    if namespace is None:
        raise click.BadParameter("give the namespace too, e.g. `group/project` or `username/project`")

    async def work(session: AsyncSession, op: Principal) -> int:
        project = await projects.create_project(session, op, name or path, path, namespace)
        if maintainer:
            await members.add_project_member(session, op, project, maintainer, 40)
        return project.id

    click.echo(f"project {full_path} created with id {in_transaction(hub, work)}")


@project_group.command("list")
@pass_hub
def project_list(hub: HubContext) -> None:
    """List projects as a table."""

    async def work(session: AsyncSession, op: Principal) -> list[Project]:
        return list(await session.scalars(projects.visible_projects_query(op)))

    rows = [(p.id, p.full_path, p.name) for p in in_transaction(hub, work)]
    print_table("projects", ["id", "full path", "name"], rows)


@click.group("member")
def member_group() -> None:
    """Manage project and group memberships."""


@member_group.command("add")
@click.argument("target")
@click.argument("username")
@click.argument("role")
@pass_hub
def member_add(hub: HubContext, target: str, username: str, role: str) -> None:
    """Give USERNAME the ROLE (guest, reporter, developer, maintainer, owner) on TARGET, a project or group path."""
    try:
        level = parse_role(role)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ROLE") from exc

    async def work(session: AsyncSession, op: Principal) -> str:
        project = await session.scalar(select(Project).where(Project.full_path == target))
        if project is None:
            project = await find_project(session, target) if is_ascii_number(target) else None
        if project is not None:
            await members.add_project_member(session, op, project, username, level)
            return f"project {project.full_path}"
        group = await find_group(session, target)
        await members.add_group_member(session, op, group, username, level)
        return f"group {group.full_path}"

    where = in_transaction(hub, work)
    click.echo(f"{username} is now {level.label} of {where}")


@member_group.command("list")
@click.argument("target")
@pass_hub
def member_list(hub: HubContext, target: str) -> None:
    """List the members of TARGET (a project or group path), including inherited ones, as a table."""

    async def work(session: AsyncSession, op: Principal) -> list[members.Member]:
        project = await session.scalar(select(Project).where(Project.full_path == target))
        if project is not None:
            return await members.project_members(session, op, project, inherited=True)
        return await members.group_members(session, op, await find_group(session, target), inherited=True)

    rows = [(m.user.id, m.user.username, m.access_level) for m in in_transaction(hub, work)]
    print_table(f"members of {target}", ["id", "username", "access level"], rows)
