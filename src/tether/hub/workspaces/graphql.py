"""The GraphQL API at ``/api/graphql``: GitLab's workspace names (reference §6.2), served with Strawberry.

``workspaceCreate`` and ``workspaceUpdate`` mutations, the ``workspaces`` query and ``workspace(id)``.
Authentication as the REST API: a personal access token in ``PRIVATE-TOKEN`` or ``Authorization: Bearer``
(401 without one). Global ids are GitLab's (``gid://gitlab/RemoteDevelopment::Workspace/1``,
``gid://gitlab/Clusters::Agent/1``, ``gid://gitlab/Project/1``); plain numbers are accepted too.
A rule a value breaks is returned in the payload's ``errors``, naming the field; a workspace, project or
agent the caller may not see is a top-level GraphQL error with GitLab's "does not exist or you don't have
permission" message, so nothing leaks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated

import strawberry
from fastapi import Depends, Request
from graphql import GraphQLError
from sqlalchemy.ext.asyncio import AsyncSession
from strawberry.extensions import MaxTokensLimiter, QueryDepthLimiter
from strawberry.fastapi import BaseContext, GraphQLRouter
from strawberry.types import ExecutionContext, Info

from tether.hub.api.auth import authenticated
from tether.hub.api.connections import announce_workspace_changes
from tether.hub.api.state import hub_state
from tether.hub.db.engine import Database
from tether.hub.db.workspaces import Workspace as WorkspaceRow
from tether.hub.errors import BadRequest, Forbidden, NotFound
from tether.hub.service.principal import Principal
from tether.hub.workspaces import listing, operations
from tether.hub.workspaces.address import address

log = logging.getLogger(__name__)
NO_ACCESS = (
    "The resource that you are attempting to access does not exist or you don't have permission to perform this action"
)
GID_WORKSPACE = "gid://gitlab/RemoteDevelopment::Workspace/"
GID_AGENT = "gid://gitlab/Clusters::Agent/"
GID_PROJECT = "gid://gitlab/Project/"
GID_USER = "gid://gitlab/User/"
#: Most workspaces one ``workspaces`` query returns.
MAX_PAGE = 1000


class Context(BaseContext):
    """Per request: the caller, the database, and who to tell about changed workspaces (kas)."""

    def __init__(
        self, principal: Principal, db: Database, announce: Callable[[list[str]], Awaitable[None]] | None = None
    ) -> None:
        super().__init__()
        self.principal = principal
        self.db = db
        self.announce = announce

    async def changed(self, name: str) -> None:
        """Workspace ``name`` was created or its desired state changed (after the commit)."""
        if self.announce is not None:
            await self.announce([name])


def _ids(values: list[strawberry.ID] | None, prefix: str, argument: str) -> list[int]:
    if values and len(values) > MAX_PAGE:
        raise BadRequest.field(argument, f"at most {MAX_PAGE} ids")
    return [_id(value, prefix, argument) for value in values or []]


def _id(value: str | int, prefix: str, argument: str) -> int:
    text = str(value)
    if text.startswith(prefix):
        text = text[len(prefix) :]
    if not text.isdigit():
        raise BadRequest.field(argument, f"{value!r} is not a {prefix}<number> global id")
    return int(text)


@strawberry.type(description="The cluster agent a workspace runs through.")
class ClusterAgentRef:
    """An agent, by global id and name."""

    id: strawberry.ID
    name: str


@strawberry.type(description="The owner of a workspace.")
class UserRef:
    """A user, by global id and username."""

    id: strawberry.ID
    username: str


@strawberry.type(description="A remote development workspace.")
class Workspace:
    """GitLab's ``Workspace`` type (reference §6.2), plus ``actualStateMessage``."""

    id: strawberry.ID
    name: str
    namespace: str
    project_id: strawberry.ID
    cluster_agent: ClusterAgentRef
    user: UserRef
    desired_state: str
    desired_state_updated_at: datetime
    actual_state: str
    actual_state_updated_at: datetime
    actual_state_message: str = strawberry.field(description="Tether: why the workspace is Failed or in Error.")
    responded_to_agent_at: datetime | None
    deployment_resource_version: str | None
    force_include_all_resources: bool
    project_ref: str
    devfile_ref: str
    devfile_path: str | None
    devfile: str
    url: str
    workspaces_agent_config_version: int
    max_hours_before_termination: int
    created_at: datetime
    updated_at: datetime


@strawberry.type(description="A page of workspaces.")
class WorkspaceConnection:
    """``nodes`` in newest-first order and how many matched."""

    nodes: list[Workspace]
    count: int


@strawberry.input(description="Arguments of workspaceCreate.")
class WorkspaceCreateInput:
    """GitLab's arguments; ``devfile`` and ``name`` are Tether's (the hub keeps no repositories)."""

    cluster_agent_id: strawberry.ID
    project_id: strawberry.ID
    desired_state: str
    project_ref: str | None = None
    devfile_ref: str | None = strawberry.field(default=None, deprecation_reason="Use projectRef.")
    devfile_path: str | None = None
    devfile: str | None = strawberry.field(default=None, description="The devfile YAML; default devfile if null.")
    name: str | None = strawberry.field(default=None, description="A DNS label; generated if null.")
    client_mutation_id: str | None = None


@strawberry.input(description="Arguments of workspaceUpdate.")
class WorkspaceUpdateInput:
    """The workspace and its new desired state."""

    id: strawberry.ID
    desired_state: str
    client_mutation_id: str | None = None


@strawberry.type
class WorkspacePayload:
    """``workspace`` (null on error) and ``errors``."""

    workspace: Workspace | None
    errors: list[str]
    client_mutation_id: str | None = None


async def _views(session: AsyncSession, rows: list[WorkspaceRow]) -> list[Workspace]:
    extra = await listing.related(session, [row.id for row in rows])
    views = []
    for row in rows:
        near = extra[row.id]
        views.append(
            Workspace(
                id=strawberry.ID(f"{GID_WORKSPACE}{row.id}"),
                name=row.name,
                namespace=row.namespace,
                project_id=strawberry.ID(f"{GID_PROJECT}{row.project_id}"),
                cluster_agent=ClusterAgentRef(
                    id=strawberry.ID(f"{GID_AGENT}{row.cluster_agent_id}"), name=near.agent_name
                ),
                user=UserRef(id=strawberry.ID(f"{GID_USER}{row.user_id}"), username=near.username),
                desired_state=row.desired_state,
                desired_state_updated_at=row.desired_state_updated_at,
                actual_state=row.actual_state,
                actual_state_updated_at=row.actual_state_updated_at,
                actual_state_message=row.actual_state_message,
                responded_to_agent_at=row.responded_to_agent_at,
                deployment_resource_version=row.deployment_resource_version,
                force_include_all_resources=row.force_include_all_resources,
                project_ref=row.project_ref,
                devfile_ref=row.project_ref,
                devfile_path=row.devfile_path,
                devfile=row.devfile,
                url=address(row.url_prefix, row.name, near.dns_zone, near.project_path),
                workspaces_agent_config_version=row.workspaces_agent_config_version,
                max_hours_before_termination=row.max_hours_before_termination,
                created_at=row.created_at,
                updated_at=row.updated_at,
            )
        )
    return views


def _hidden(exc: NotFound | Forbidden) -> Exception:
    return PermissionError(NO_ACCESS)


@strawberry.type
class Query:
    """Workspaces the caller may see: their own, or all for an administrator."""

    @strawberry.field(description="The caller's workspaces (all for an administrator), newest first.")  # type: ignore[untyped-decorator]
    async def workspaces(
        self,
        info: Info[Context, None],
        ids: list[strawberry.ID] | None = None,
        project_ids: list[strawberry.ID] | None = None,
        cluster_agent_ids: list[strawberry.ID] | None = None,
        actual_states: list[str] | None = None,
        first: int = 100,
    ) -> WorkspaceConnection:
        """Filter by ids, projects, agents or actual states; at most ``first`` (<= 1000) nodes."""
        context = info.context
        query = operations.visible_query(
            context.principal,
            ids=_ids(ids, GID_WORKSPACE, "ids"),
            project_ids=_ids(project_ids, GID_PROJECT, "projectIds"),
            agent_ids=_ids(cluster_agent_ids, GID_AGENT, "clusterAgentIds"),
            actual_states=(actual_states or [])[:20],
        )
        async with context.db.transaction() as session:
            rows = list(await session.scalars(query.limit(max(1, min(first, MAX_PAGE)))))
            return WorkspaceConnection(nodes=await _views(session, rows), count=len(rows))

    @strawberry.field(description="One workspace by global id.")  # type: ignore[untyped-decorator]
    async def workspace(self, info: Info[Context, None], id: strawberry.ID) -> Workspace | None:
        """Null when it does not exist or is someone else's."""
        context = info.context
        async with context.db.transaction() as session:
            try:
                row = await operations.get(session, context.principal, _id(id, GID_WORKSPACE, "id"))
            except (NotFound, BadRequest):
                return None
            return (await _views(session, [row]))[0]


def _errors(exc: BadRequest) -> list[str]:
    message = exc.message
    if isinstance(message, str):
        return [message]
    return [f"{field}: {problem}" for field, problems in message.items() for problem in problems]


@strawberry.type
class Mutation:
    """GitLab's workspace mutations."""

    @strawberry.mutation(description="Create a workspace (Developer or above on the project).")  # type: ignore[untyped-decorator]
    async def workspace_create(self, info: Info[Context, None], input: WorkspaceCreateInput) -> WorkspacePayload:
        """Errors naming the field in ``errors``; no access at all is a top-level error."""
        context = info.context
        try:
            request = operations.CreateRequest(
                cluster_agent_id=_id(input.cluster_agent_id, GID_AGENT, "clusterAgentId"),
                project_id=_id(input.project_id, GID_PROJECT, "projectId"),
                desired_state=input.desired_state,
                project_ref=input.project_ref or input.devfile_ref or "main",
                devfile_path=input.devfile_path,
                devfile=input.devfile,
                name=input.name,
            )
            async with context.db.transaction() as session:
                row = await operations.create(session, context.principal, request)
                view = (await _views(session, [row]))[0]
            await context.changed(view.name)  # a refusal kas cached for the new name must go
        except BadRequest as exc:
            return WorkspacePayload(workspace=None, errors=_errors(exc), client_mutation_id=input.client_mutation_id)
        except (NotFound, Forbidden) as exc:
            raise _hidden(exc) from exc
        return WorkspacePayload(workspace=view, errors=[], client_mutation_id=input.client_mutation_id)

    @strawberry.mutation(description="Change a workspace's desired state (its owner or an administrator).")  # type: ignore[untyped-decorator]
    async def workspace_update(self, info: Info[Context, None], input: WorkspaceUpdateInput) -> WorkspacePayload:
        """``desiredState``: Running, RestartRequested, Stopped or Terminated (final)."""
        context = info.context
        try:
            workspace_id = _id(input.id, GID_WORKSPACE, "id")
            async with context.db.transaction() as session:
                row = await operations.update(session, context.principal, workspace_id, input.desired_state)
                view = (await _views(session, [row]))[0]
            await context.changed(view.name)
        except BadRequest as exc:
            return WorkspacePayload(workspace=None, errors=_errors(exc), client_mutation_id=input.client_mutation_id)
        except (NotFound, Forbidden) as exc:
            raise _hidden(exc) from exc
        return WorkspacePayload(workspace=view, errors=[], client_mutation_id=input.client_mutation_id)


class _Schema(strawberry.Schema):
    """Logs a refusal (no access) as one line; anything else with its traceback, as Strawberry does."""

    def process_errors(self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None) -> None:
        """Report each error of a request."""
        unexpected = []
        for error in errors:
            if isinstance(error.original_error, PermissionError) or error.original_error is None:
                log.info("graphql: %s (path %s)", error.message, error.path)
            else:
                unexpected.append(error)
        if unexpected:
            super().process_errors(unexpected, execution_context)


schema = _Schema(
    query=Query,
    mutation=Mutation,
    extensions=[lambda: QueryDepthLimiter(max_depth=8), lambda: MaxTokensLimiter(max_token_count=4000)],
)


async def _context(request: Request, principal: Annotated[Principal, Depends(authenticated)]) -> Context:
    state = hub_state(request)
    return Context(principal=principal, db=state.db, announce=lambda names: announce_workspace_changes(state, names))


def router() -> GraphQLRouter[Context, None]:
    """The ``/api/graphql`` router (no in-browser IDE: it would load scripts from the internet)."""
    return GraphQLRouter(schema, path="/api/graphql", graphql_ide=None, context_getter=_context, tags=["graphql"])
