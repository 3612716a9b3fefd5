"""agentk's configuration watcher: one long ``GetConfiguration`` stream to kas (kas.md §6.2-6.3).

Like upstream agentk 16.x, the stream is opened with ``skip_register = true`` and the pod registers itself
through ``AgentRegistrar.Register`` (:mod:`tether.modules.agent_registrar.agent`), so Tether agentk and
upstream kas understand each other; ``skip_register = false`` (the stream *is* the tracked connection, seed 000)
stays available for callers that want it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog
from grpc import aio

from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2
from tether.pb.gitlab.agent.entity import entity_pb2
from tether.tool.backoff import Backoff
from tether.tool.grpc_meta import Metadata

__all__ = ["ConfigurationError", "ConfigurationWatcher", "watch_backoff"]

_log = structlog.get_logger(__name__)

#: Callback receiving each accepted configuration.
ConfigurationCallback = Callable[[agentcfg_pb2.AgentConfiguration], None]


_HEALTHY_STREAM_S = 5.0


def watch_backoff() -> Backoff:
    """Backoff after a failed stream: 10 s to 5 min, factor 2, jitter 1, reset after 10 min (kas.md §6.3)."""
    return Backoff(initial_s=10.0, max_s=300.0, factor=2.0, jitter=1.0, reset_after_s=600.0)


class ConfigurationError(ValueError):
    """kas sent a configuration agentk must refuse (missing commit id, agent id changed)."""


class ConfigurationWatcher:
    """Keeps one ``GetConfiguration`` stream open and hands every new configuration to a callback.

    Per response: the commit id is remembered (a reconnect resumes from it), the agent id is pinned (a
    later different value is a :class:`ConfigurationError`: the stream is dropped and retried with
    backoff), then ``on_configuration`` runs. A clean end of the stream reconnects at once; errors back
    off (:func:`watch_backoff`).

    Args:
        channel: channel to kas' agent listener.
        agent_meta: sent in every request.
        on_configuration: called (synchronously) with each accepted ``AgentConfiguration``.
        metadata: per-RPC metadata, ``authorization: Bearer <token>`` plus ``--kas-header`` pairs.
        backoff: delays after failures; defaults to :func:`watch_backoff`.
        skip_register: sent as ``skip_register``; True when the pod registers through ``AgentRegistrar``.
        on_stream_end: called after each stream ended, before the next one is opened (the registrar re-registers
            through the kas the next stream reaches).
    """

    def __init__(
        self,
        channel: aio.Channel,
        agent_meta: entity_pb2.AgentMeta,
        on_configuration: ConfigurationCallback,
        *,
        metadata: Metadata = (),
        backoff: Backoff | None = None,
        skip_register: bool = True,
        on_stream_end: Callable[[], None] | None = None,
    ) -> None:
        self._stub = rpc_pb2_grpc.AgentConfigurationStub(channel)
        self._skip_register = skip_register
        self._on_stream_end = on_stream_end
        self._agent_meta = agent_meta
        self._on_configuration = on_configuration
        self._metadata = metadata
        self._backoff = backoff or watch_backoff()
        self._commit_id = ""
        self._agent_id: int | None = None
        self._received = False

    @property
    def agent_id(self) -> int | None:
        """The agent id kas reported, once the first configuration arrived."""
        return self._agent_id

    @property
    def commit_id(self) -> str:
        """Commit id of the last accepted configuration (empty before the first)."""
        return self._commit_id

    @property
    def has_configuration(self) -> bool:
        """Whether at least one configuration was accepted (part of agentk readiness)."""
        return self._received

    async def run(self) -> None:
        """Watch until cancelled; never returns on its own."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            ended_cleanly = await self._watch_once()
            if self._on_stream_end is not None:
                self._on_stream_end()
            if ended_cleanly:
                continue
            # A stream that was up for a while and then broke (e.g. its kas died) retries at once, to
            # another kas; only quick repeated failures back off.
            if loop.time() - started > _HEALTHY_STREAM_S:
                self._backoff.reset()
                continue
            await asyncio.sleep(self._backoff.next_delay())

    async def _watch_once(self) -> bool:
        """One stream; True when it ended cleanly (reconnect at once), False after a failure (back off)."""
        request = rpc_pb2.ConfigurationRequest(
            commit_id=self._commit_id, agent_meta=self._agent_meta, skip_register=self._skip_register
        )
        call = self._stub.GetConfiguration(request, metadata=self._metadata, wait_for_ready=True)
        try:
            async for response in call:
                self._accept(response)
        except aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                _log.error("configuration_token_rejected", code=code.name, details=details)
            else:
                _log.warning("configuration_stream_failed", code=code.name, details=details)
            return False
        except ConfigurationError as exc:
            _log.error("configuration_rejected", error=str(exc))
            return False
        except Exception:
            _log.exception("configuration_callback_failed", commit_id=self._commit_id)
            return False
        finally:
            call.cancel()
        _log.debug("configuration_stream_ended", commit_id=self._commit_id)
        return True

    def _accept(self, response: rpc_pb2.ConfigurationResponse) -> None:
        if not response.commit_id:
            raise ConfigurationError("configuration without commit id")
        config = response.configuration
        if self._agent_id is None:
            self._agent_id = config.agent_id
        elif config.agent_id != self._agent_id:
            raise ConfigurationError(f"agent id changed from {self._agent_id} to {config.agent_id}")
        self._on_configuration(config)
        self._commit_id = response.commit_id
        self._received = True
        _log.info("configuration_applied", commit_id=response.commit_id, agent_id=self._agent_id)
