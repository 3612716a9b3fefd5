"""Live agent connections, asked from kas' agent tracker through the api listener (seed 000, kas.md §4.2).

The REST agent resource must answer even when kas is down: then the list is empty and ``connections_error``
says why, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import UTC
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.api.schemas_out import ConnectionOut
from tether.hub.api.state import HubState
from tether.hub.service import revocation_outbox as outbox
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo

log = logging.getLogger(__name__)


def connection_out(info: ConnectedAgentInfo) -> ConnectionOut:
    """Build a :class:`ConnectionOut` from kas' ``ConnectedAgentInfo``."""
    meta = info.agent_meta
    return ConnectionOut(
        connection_id=info.connection_id,
        agent_version=meta.version,
        agent_commit=meta.commit_id,
        pod_name=meta.pod_name,
        pod_namespace=meta.pod_namespace,
        connected_at=info.connected_at.ToDatetime(tzinfo=UTC) if info.HasField("connected_at") else None,
        kubernetes_version=meta.kubernetes_version.git_version,
        kas_url=info.kas_url or None,
    )


async def agent_connections(state: HubState, agent_id: int) -> tuple[list[ConnectionOut], str | None]:
    """(connections, error): the agent's live connections, or an empty list and the reason kas gave none."""
    if state.kas is None:
        return [], "kas api address is not configured (kas.api_address)"
    try:
        infos = await state.kas.connected_agents_by_agent_id(agent_id, timeout_s=state.config.kas.timeout)
    except grpc.aio.AioRpcError as exc:
        log.warning("kas api: listing connections of agent %d failed: %s", agent_id, exc.code().name)
        return [], f"kas unavailable: {exc.code().name}: {exc.details()}"
    connections = sorted((connection_out(i) for i in infos), key=lambda c: c.connection_id)
    return connections, None


async def announce_revoked_tokens(
    state: HubState, agent_id: int, digests_hex: list[str], revocation_id: int | None = None
) -> None:
    """Tell kas that these agent tokens were revoked, so every kas closes what they opened (issue 9 item 7).

    After the database change is committed; delivered in the background and retried until a kas acknowledges
    (issue 27 item 6), so the answer to the user does not wait for kas. Without ``kas.api_address`` kas still
    refuses the tokens once its ``info_cache_ttl`` passes. ``revocation_id`` is the revocation's row in
    ``pending_revocations`` (:func:`record_revocation`): deleted once delivered or given up; left for another
    replica's sweep if this one stops first (issue 26 item 2).
    """
    if state.kas is None or not digests_hex:
        return
    delivery = state.kas.announce_revocation(agent_id, digests_hex, timeout_s=state.config.kas.timeout)
    if revocation_id is None:
        return
    if delivery is None:  # this hub delivers as many as it may already: the sweeps take this one now
        log.warning(
            "kas api: revocation %d of agent %d is left to the sweeps (too many under way)", revocation_id, agent_id
        )
        _in_background(outbox.hand_over(state.db, revocation_id))
        return

    revocations = state.revocations
    if revocations is not None:
        revocations.holding(revocation_id)

    def done(task: asyncio.Task[bool]) -> None:
        if task.cancelled():  # this hub stops: its sweeper handed the revocation over to the other replicas
            return
        if revocations is not None:
            revocations.released(revocation_id)
        _in_background(outbox.forget(state.db, revocation_id))

    delivery.add_done_callback(done)


def _in_background(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def record_revocation(
    session: AsyncSession, state: HubState, agent_id: int, digests_hex: list[str]
) -> int | None:
    """Write the revocation to deliver in the revoking transaction; its id, or None when there is no kas to tell."""
    if state.kas is None or not digests_hex:
        return None
    row = outbox.add(session, agent_id, digests_hex)
    await session.flush()
    return row.id


#: Database writes about revocations under way (kept referenced until done).
_background: set[asyncio.Task[None]] = set()


async def announce_workspace_changes(state: HubState, names: list[str]) -> None:
    """Tell kas that these workspaces changed, so every kas stops answering from what it cached (issue 13).

    Best effort after the database change is committed: without kas, kas' answers expire after its
    ``workspaces.authorization_cache_ttl``.
    """
    if state.kas is None or not names:
        return
    unique = sorted(set(names))
    try:
        for start in range(0, len(unique), 1000):
            await state.kas.invalidate_workspaces(unique[start : start + 1000], timeout_s=state.config.kas.timeout)
    except grpc.aio.AioRpcError as exc:
        log.warning(
            "kas api: announcing %d changed workspace(s) failed: %s; kas serves them from its cache for its TTL",
            len(unique),
            exc.code().name,
        )
