"""The registrar's bound on pods per agent (pure logic: a memory store and a stand-in for the token check)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.gitlab_client import AgentInfo
from tether.modules.agent_registrar.server import AgentRegistrarServicer
from tether.pb.gitlab.agent.agent_registrar.rpc import rpc_pb2
from tether.pb.gitlab.agent.entity.entity_pb2 import AgentMeta
from tether.tool.events import EventBus
from tether.tool.memory_backend import MemoryBackend


class _Auth:
    def __init__(self, agent: AgentInfo) -> None:
        self.agent = agent

    async def authenticate(self, _metadata: Any) -> AgentInfo:
        return self.agent


class _Context:
    """Records the status of ``abort`` and raises what grpc.aio raises."""

    code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise grpc.aio.AbortError(details)


async def test_a_new_pod_beyond_the_limit_is_refused_but_known_pods_refresh() -> None:
    backend = MemoryBackend()
    tracker = AgentTracker(backend, EventBus(backend))
    agent = AgentInfo(agent_id=5, project_id=50, agent_name="a", default_branch="main")
    servicer = AgentRegistrarServicer(_Auth(agent), tracker, max_pods=2)  # type: ignore[arg-type]
    meta = AgentMeta(pod_name="p")
    for pod in (1, 2, 1, 2):
        await servicer.Register(rpc_pb2.RegisterRequest(agent_meta=meta, pod_id=pod), _Context())
    context = _Context()
    with pytest.raises(grpc.aio.AbortError):
        await servicer.Register(rpc_pb2.RegisterRequest(agent_meta=meta, pod_id=3), context)
    assert context.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [c.connection_id for c in await tracker.connections_by_agent_id(5)] == [1, 2]
