"""The GraphQL API at ``/api/graphql``: GitLab's workspace names (reference §6.2), served with Strawberry.

``workspaceCreate`` and ``workspaceUpdate`` mutations, the ``workspaces`` query and ``workspace(id)``.
Authentication as the REST API: a personal access token in ``PRIVATE-TOKEN`` or ``Authorization: Bearer``
(401 without one). Scopes as GitLab's (issue 27 item 4): a query needs ``api`` or ``read_api``, a mutation
``api``; checked for the whole operation before it runs, so no field is reachable without them, and the error
names the missing scope. Cost (issue 27 item 3): a request is reckoned before it runs
(:mod:`~tether.hub.api.graphql_cost`) and refused at once beyond the budget; all its fields share one
database session, queries one read-only transaction. Global ids are GitLab's (``gid://gitlab/RemoteDevelopment::Workspace/1``,
``gid://gitlab/Clusters::Agent/1``, ``gid://gitlab/Project/1``); plain numbers are accepted too.
A rule a value breaks is returned in the payload's ``errors``, naming the field; a workspace, project or
agent the caller may not see is a top-level GraphQL error with GitLab's "does not exist or you don't have
permission" message, so nothing leaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

import strawberry
from fastapi import Depends, Request
from graphql import GraphQLError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer
from strawberry.extensions import MaxTokensLimiter, SchemaExtension
from strawberry.fastapi import BaseContext, GraphQLRouter
from strawberry.types import ExecutionContext, Info
from strawberry.types.graphql import OperationType

from tether.hub.api.auth import authenticated
from tether.hub.api.connections import announce_workspace_changes
from tether.hub.api.graphql_cost import Budget, Cost, budget_rule
from tether.hub.api.state import hub_state
from tether.hub.db.engine import Database
from tether.hub.db.workspaces import Workspace as WorkspaceRow
from tether.hub.errors import BadRequest, Forbidden, HubError, NotFound
from tether.hub.service.principal import SCOPE_API, SCOPE_READ_API, Principal
from tether.hub.workspaces import listing, operations
from tether.hub.workspaces.address import address
from tether.modules.remote_development.hub.devfile import DEFAULT_DEVFILE

log = logging.getLogger(__name__)
NO_ACCESS = (
    "The resource that you are attempting to access does not exist or you don't have permission to perform this action"
)
GID_WORKSPACE = "gid://gitlab/RemoteDevelopment::Workspace/"
GID_AGENT = "gid://gitlab/Clusters::Agent/"
GID_PROJECT = "gid://gitlab/Project/"
GID_USER = "gid://gitlab/User/"
#: What one request may ask for (issue 27 item 3).
BUDGET = Budget()
#: Most workspaces one ``workspaces`` field returns.
MAX_PAGE = BUDGET.page
#: Most tokens of a document (checked while parsing, before the budget).
MAX_TOKENS = 4000
#: Largest request body, read only after authentication: a 64 KiB devfile, escaped, and the query fit well.
MAX_BODY_BYTES = 1024 * 1024
#: Scopes an operation needs, any one of them (GitLab: ``read_api`` reads, only ``api`` writes).
NEEDED_SCOPES = {
    OperationType.QUERY: (SCOPE_API, SCOPE_READ_API),
    OperationType.MUTATION: (SCOPE_API,),
}


class Context(BaseContext):
    """Per request: the caller, its one database session, and who to tell about changed workspaces (kas).

    Args:
        principal: the caller.
        db: the database.
        announce: called with the names of created or changed workspaces, after the commit.
        user_limit: the hub's ``workspaces.max_active_workspaces_per_user``.
        default_devfile: the devfile of a create without one (the hub's ``workspaces.default_devfile``).
        workspaces_url: the hub's ``kas.workspaces_url`` (None: the host form), for each workspace's ``url``.
    """

    def __init__(
        self,
        principal: Principal,
        db: Database,
        announce: Callable[[list[str]], Awaitable[None]] | None = None,
        user_limit: int = -1,
        default_devfile: str = DEFAULT_DEVFILE,
        workspaces_url: str | None = None,
    ) -> None:
        super().__init__()
        self.default_devfile = default_devfile
        self.workspaces_url = workspaces_url
        self.principal = principal
        self.db = db
        self.announce = announce
        self.user_limit = user_limit
        self.default_devfile = default_devfile
        #: Whether the request selects ``devfile`` anywhere (set before execution); lists skip loading it if not.
        self.wants_devfile = True
        self._session: AsyncSession | None = None
        self._lock = asyncio.Lock()  # aliased fields resolve concurrently; a session serves one at a time

    @asynccontextmanager
    async def transaction(self, write: bool) -> AsyncIterator[AsyncSession]:
        """The request's session, for one field at a time.

        A query's fields share one read-only transaction, ended by :meth:`close`; a mutation's field commits
        when its block ends (kas is told after that). Either rolls back when the block raises.
        """
        async with self._lock:
            if self._session is None:
                self._session = self.db.session(read_only=not write)
            try:
                yield self._session
                if write:
                    await self._session.commit()
            except BaseException:
                await self._session.rollback()
                raise

    async def close(self) -> None:
        """End the request's session (its read transaction, if any, is rolled back)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

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
    actual_state_message: str = strawberry.field(
        description="Tether: why the workspace is Failed or in Error, or what a Starting one waits on."
    )
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


async def _views(
    session: AsyncSession, rows: list[WorkspaceRow], workspaces_url: str | None, with_devfile: bool = True
) -> list[Workspace]:
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
                devfile=row.devfile if with_devfile else "",  # not selected, so never sent
                url=address(row.url_prefix, row.name, near.dns_zone, near.project_path, workspaces_url),
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
        if not context.wants_devfile:  # up to 64 KiB a row, unasked
            query = query.options(defer(WorkspaceRow.devfile, raiseload=True))
        async with context.transaction(write=False) as session:
            rows = list(await session.scalars(query.limit(max(1, min(first, MAX_PAGE)))))
            nodes = await _views(session, rows, context.workspaces_url, context.wants_devfile)
            return WorkspaceConnection(nodes=nodes, count=len(rows))

    @strawberry.field(description="One workspace by global id.")  # type: ignore[untyped-decorator]
    async def workspace(self, info: Info[Context, None], id: strawberry.ID) -> Workspace | None:
        """Null when it does not exist or is someone else's."""
        context = info.context
        async with context.transaction(write=False) as session:
            try:
                row = await operations.get(session, context.principal, _id(id, GID_WORKSPACE, "id"))
            except (NotFound, BadRequest):
                return None
            # The request's session may hold this row from a ``workspaces`` field with its devfile deferred.
            return (await _views(session, [row], context.workspaces_url, context.wants_devfile))[0]


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
            async with context.transaction(write=True) as session:
                row = await operations.create(
                    session,
                    context.principal,
                    request,
                    user_limit=context.user_limit,
                    default_devfile=context.default_devfile,
                )
                view = (await _views(session, [row], context.workspaces_url))[0]
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
            async with context.transaction(write=True) as session:
                row = await operations.update(session, context.principal, workspace_id, input.desired_state)
                view = (await _views(session, [row], context.workspaces_url))[0]
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


def scope_error(principal: Principal, operation: OperationType) -> GraphQLError | None:
    """The error for a ``principal`` whose token may not run an ``operation``, or None when it may.

    GitLab's rule: a query needs ``api`` or ``read_api``, a mutation ``api``, anything else is refused. The
    message names the scopes needed and those the token has; ``extensions.code`` is ``insufficient_scope``.
    """
    needed = NEEDED_SCOPES.get(operation, ())
    if principal.scopes & set(needed):
        return None
    has = ", ".join(sorted(principal.scopes)) or "none"
    return GraphQLError(
        f"insufficient_scope: a {operation.value} needs a token with the {' or '.join(needed) or '(no)'} scope "
        f"(this token has: {has})",
        extensions={"code": "insufficient_scope", "required_scopes": list(needed)},
    )


class _RequestGuard(SchemaExtension):
    """Guards a request: scope and budget before anything runs, and the session closed at the end.

    A token without the scope, or a request beyond :data:`BUDGET`, gets its GraphQL error at once.
    """

    def __init__(self, *, execution_context: ExecutionContext | None = None) -> None:
        if execution_context is not None:
            self.execution_context = execution_context
        self._costs: list[Cost] = []

    async def on_operation(self) -> AsyncIterator[None]:
        """Add the budget rule (it needs this request's variables); close the session at the end."""
        ctx = self.execution_context
        ctx.validation_rules = (*ctx.validation_rules, budget_rule(BUDGET, ctx.variables, self._costs.append))
        try:
            yield
        finally:
            context = ctx.context
            if isinstance(context, Context):
                await context.close()

    def on_validate(self) -> Any:
        """Check the scope first: a token that may not run the operation learns nothing more."""
        ctx = self.execution_context
        context = ctx.context
        if isinstance(context, Context):
            error = scope_error(context.principal, ctx.operation_type)
            if error is not None:
                ctx.pre_execution_errors = [error]  # Strawberry then skips validation and execution
        yield
        if isinstance(context, Context):
            context.wants_devfile = any(cost.devfiles for cost in self._costs)


schema = _Schema(
    query=Query,
    mutation=Mutation,
    extensions=[
        lambda: MaxTokensLimiter(max_token_count=MAX_TOKENS),
        _RequestGuard,
    ],
)


class RequestTooLarge(HubError):
    """413: the request body is over :data:`MAX_BODY_BYTES`."""

    status = 413


async def _bounded_body(request: Request) -> None:
    # Strawberry reads the whole body before the token limit applies; read it here, bounded, and leave it where
    # Starlette's Request.body() finds it.
    too_large = f"413 Request Entity Too Large - a GraphQL request is at most {MAX_BODY_BYTES} bytes"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestTooLarge(too_large)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise RequestTooLarge(too_large)
    request._body = bytes(body)


async def _context(request: Request, principal: Annotated[Principal, Depends(authenticated)]) -> Context:
    if request.method == "POST":
        await _bounded_body(request)
    state = hub_state(request)
    return Context(
        principal=principal,
        db=state.db,
        announce=lambda names: announce_workspace_changes(state, names),
        user_limit=state.config.workspaces.max_active_workspaces_per_user,
        default_devfile=state.config.workspaces.default_devfile,
        workspaces_url=state.config.kas.workspaces_url,
    )


def router() -> GraphQLRouter[Context, None]:
    """The ``/api/graphql`` router (no in-browser IDE: it would load scripts from the internet)."""
    return GraphQLRouter(schema, path="/api/graphql", graphql_ide=None, context_getter=_context, tags=["graphql"])
