"""A Gitaly-compatible gRPC service that serves agent configuration files to upstream kas (docs/interop.md).

Upstream kas reads ``.gitlab/agents/<agent name>/config.yaml`` from the agent's project repository through
Gitaly (kas.md §6.1): ``SmartHTTPService.InfoRefsUploadPack`` to learn the default branch's commit, then
``CommitService.TreeEntry`` for the file at that commit. Tether keeps configurations in the hub, not in git, so
this service answers exactly those two calls from the hub's database and nothing else:

* the repository is the project named by ``gl_repository = "project-<id>"`` (what ``agent_info`` sends);
* its only branch is the project's default branch, whose "commit" is a 40-hex digest of the versions of all of
  the project's agent configurations, so it changes whenever one of them does;
* ``TreeEntry`` returns the agent's stored YAML whatever the revision (there is no history); a path that is not
  an agent configuration file, or an agent without one, is ``NOT_FOUND`` (kas then runs the agent on defaults).

Every call must carry Gitaly's v2 token (``authorization: Bearer v2.<hex HMAC-SHA256(token, ts)>.<ts>``) made
with the token the hub hands to kas in ``agent_info``; a missing, wrong or stale one is ``UNAUTHENTICATED``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.agents import AgentConfiguration, ClusterAgent
from tether.hub.db.engine import Database, kas_lane
from tether.hub.db.namespaces import Project
from tether.pb.gitlab.agent.gitaly_compat import gitaly_pb2, gitaly_pb2_grpc

log = logging.getLogger(__name__)

STORAGE_NAME = "tether"
#: Seconds a v2 token's timestamp may differ from the hub's clock (Gitaly allows a similar window).
TOKEN_WINDOW_S = 60
CHUNK_BYTES = 64 * 1024
_CONFIG_PATH = re.compile(r"^\.gitlab/agents/([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)/config\.yaml$")
_GL_REPOSITORY = re.compile(r"^project-([1-9][0-9]{0,18})$")


def repository_for(project_id: int, full_path: str) -> dict[str, str]:
    """The ``gitaly_repository`` JSON ``agent_info`` sends for a project (what this service understands).

    Args:
        project_id: the project's id.
        full_path: its path, ``group/project``.
    """
    return {
        "storage_name": STORAGE_NAME,
        "relative_path": f"{full_path}.git",
        "gl_repository": f"project-{project_id}",
        "gl_project_path": full_path,
    }


async def configuration_file(session: AsyncSession, project: Project, path: str) -> str | None:
    """The stored YAML at repository ``path`` of ``project``: only ``.gitlab/agents/<agent>/config.yaml`` exists.

    Returns None for any other path and for an agent without a configuration.
    """
    match = _CONFIG_PATH.match(path)
    if match is None:
        return None
    return await session.scalar(
        select(AgentConfiguration.content)
        .join(ClusterAgent, AgentConfiguration.agent_id == ClusterAgent.id)
        .where(ClusterAgent.project_id == project.id, ClusterAgent.name == match[1])
    )


def sign_v2(token: str, now_s: float | None = None) -> str:
    """Gitaly's v2 bearer value for ``token`` at ``now_s`` (unix seconds): ``v2.<hex hmac>.<ts>``."""
    stamp = str(int(time.time() if now_s is None else now_s))
    return f"v2.{hmac.new(token.encode(), stamp.encode(), hashlib.sha256).hexdigest()}.{stamp}"


def check_v2(token: str, metadata: Any, now_s: float | None = None) -> str | None:
    """Return why ``metadata`` does not carry a valid v2 token for ``token``, or None when it does."""
    values = [v for k, v in metadata or () if k == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str) or not values[0].startswith("Bearer "):
        return "missing Gitaly token"
    parts = values[0][7:].split(".")
    if len(parts) != 3 or parts[0] != "v2" or not parts[2].isdigit():
        return "malformed Gitaly token"
    now = time.time() if now_s is None else now_s
    if abs(now - int(parts[2])) > TOKEN_WINDOW_S:
        return "stale Gitaly token"
    expected = hmac.new(token.encode(), parts[2].encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts[1]):
        return "wrong Gitaly token"
    return None


def _pkt(line: str) -> bytes:
    data = line.encode()
    return f"{len(data) + 4:04x}".encode() + data


def advertisement(commit: str, branch: str) -> bytes:
    """The smart-HTTP reference advertisement of a repository with ``HEAD`` -> ``refs/heads/<branch>`` at ``commit``."""
    return b"".join(
        [
            _pkt("# service=git-upload-pack\n"),
            b"0000",
            _pkt(f"{commit} HEAD\0symref=HEAD:refs/heads/{branch} side-band-64k\n"),
            _pkt(f"{commit} refs/heads/{branch}\n"),
            b"0000",
        ]
    )


class _Store:
    """Reads projects and agent configurations for the service (kas calls it: kas' connection pool, read-only)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncSession]:
        with kas_lane():
            async with self._db.transaction(read_only=True) as session:
                yield session

    # One transaction per call, not one for the project and one for its data: upstream kas makes two calls per
    # agent configuration, and in a 300-agent storm they cost the hub about 16 ms of CPU per agent (issue 28).

    async def head(self, repository: gitaly_pb2.Repository) -> tuple[Project, str] | None:
        """The project and its default branch's commit (see the module docstring), or None without such a project."""
        async with self._transaction() as session:
            project = await _project(session, repository)
            if project is None:
                return None
            rows = await session.execute(
                select(ClusterAgent.id, AgentConfiguration.version)
                .join(AgentConfiguration, AgentConfiguration.agent_id == ClusterAgent.id)
                .where(ClusterAgent.project_id == project.id)
                .order_by(ClusterAgent.id)
            )
            versions = ",".join(f"{agent_id}:{version}" for agent_id, version in rows)
        text = f"tether-project-config:{project.id}:{versions}"
        return project, hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    async def file(self, repository: gitaly_pb2.Repository, path: str) -> tuple[bool, str | None]:
        """(whether the project exists, the YAML at ``path`` or None)."""
        async with self._transaction() as session:
            project = await _project(session, repository)
            if project is None:
                return False, None
            return True, await configuration_file(session, project, path)


async def _project(session: AsyncSession, repository: gitaly_pb2.Repository) -> Project | None:
    match = _GL_REPOSITORY.match(repository.gl_repository)
    if match is None or repository.storage_name != STORAGE_NAME:
        return None
    return await session.get(Project, int(match[1]))


class _SmartHttp(gitaly_pb2_grpc.SmartHTTPServiceServicer):
    def __init__(self, store: _Store, token: str) -> None:
        self._store = store
        self._token = token

    async def InfoRefsUploadPack(
        self, request: gitaly_pb2.InfoRefsRequest, context: Any
    ) -> AsyncIterator[gitaly_pb2.InfoRefsResponse]:
        await _check_token(self._token, context)
        head = await self._store.head(request.repository)
        if head is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "repository not found")
            return
        project, commit = head
        yield gitaly_pb2.InfoRefsResponse(data=advertisement(commit, project.default_branch))


class _Commits(gitaly_pb2_grpc.CommitServiceServicer):
    def __init__(self, store: _Store, token: str) -> None:
        self._store = store
        self._token = token

    async def TreeEntry(
        self, request: gitaly_pb2.TreeEntryRequest, context: Any
    ) -> AsyncIterator[gitaly_pb2.TreeEntryResponse]:
        await _check_token(self._token, context)
        found, content = await self._store.file(request.repository, request.path.decode("utf-8", "replace"))
        if not found:
            await context.abort(grpc.StatusCode.NOT_FOUND, "repository not found")
            return
        if content is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "tree entry not found")
            return
        data = content.encode()
        if request.max_size > 0 and len(data) > request.max_size:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"object size ({len(data)}) is bigger than the maximum allowed size",
            )
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        for index, chunk in enumerate(chunks):
            if index == 0:
                yield gitaly_pb2.TreeEntryResponse(
                    type=gitaly_pb2.TreeEntryResponse.BLOB, oid=oid, size=len(data), mode=0o100644, data=chunk
                )
            else:
                yield gitaly_pb2.TreeEntryResponse(data=chunk)


async def _check_token(token: str, context: Any) -> None:
    problem = check_v2(token, context.invocation_metadata())
    if problem is not None:
        log.warning("Gitaly call refused: %s", problem)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)


class GitalyServer:
    """The gRPC server of this service.

    Args:
        db: the hub's database.
        token: the shared token (text) kas signs calls with.
        listen: ``host:port``.
    """

    def __init__(self, db: Database, token: str, listen: str) -> None:
        self._listen = listen
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # never share a port silently
        store = _Store(db)
        gitaly_pb2_grpc.add_SmartHTTPServiceServicer_to_server(_SmartHttp(store, token), self._server)
        gitaly_pb2_grpc.add_CommitServiceServicer_to_server(_Commits(store, token), self._server)
        self.port = 0

    async def start(self) -> None:
        """Bind and serve.

        Raises:
            OSError: the address cannot be bound.
        """
        try:
            self.port = self._server.add_insecure_port(self._listen)
        except RuntimeError as exc:
            raise OSError(f"gitaly.listen {self._listen}: {exc}") from exc
        if self.port == 0:
            raise OSError(f"gitaly.listen {self._listen}: cannot listen (address in use?)")
        await self._server.start()
        log.info("Gitaly-compatible configuration service listening on %s", self._listen)

    async def stop(self) -> None:
        """Stop serving (in-flight calls get one second)."""
        await self._server.stop(1.0)
