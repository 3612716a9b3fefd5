"""kas' ``AgentConfiguration.GetConfiguration`` stream: the agent connection kas tracks (seed 000, kas.md §6.2).

Each open stream is one agentk connection: unless agentk asks to skip it, it is registered in the agent
tracker for as long as it stays open, under the connection id agentk sent (a random one otherwise). The
configuration comes from the hub (Tether keeps agent configuration there, not in a git repository) and is
sent again whenever its ``commit_id`` changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from tether.modserver.agent_auth import AgentAuthenticator, AuthError, bearer_token
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.api import ServerApi
from tether.modserver.gitlab_client import (
    AgentConfigurationDoc,
    AgentInfo,
    GitlabClient,
    GitlabClientError,
    GitlabTimeout,
)
from tether.modshared.module import IdleModule, Module
from tether.modules.agent_configuration.config import AgentConfigurationCF
from tether.pb.gitlab.agent.agent_configuration.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.agent_tracker.agent_tracker_pb2 import ConnectedAgentInfo
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2
from tether.tool.backoff import Backoff
from tether.tool.logs import bind_for_task, current_connection_id

log = logging.getLogger(__name__)
#: Tether's own top-level sections of the configuration document (issue 25 item 2: ``audit``).
_KAS_ONLY_SECTIONS = frozenset({"audit"})
_AGENT_FIELDS = ("gitops", "observability", "ci_access", "container_scanning", "remote_development", "flux")
_FATAL = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND}


class ConfigurationInvalid(ValueError):
    """The stored configuration does not parse as a ``ConfigurationFile`` (a user error)."""


def agent_configuration(
    doc: AgentConfigurationDoc, agent: AgentInfo, external_url: str
) -> agentcfg_pb2.AgentConfiguration:
    """Turn the stored file into what agentk receives (``user_access`` stays in kas, kas.md §6.1).

    Raises:
        ConfigurationInvalid: unknown fields or wrong types in the stored document.
    """
    try:
        # The document also holds Tether's own sections (the hub's ``TETHER_SECTIONS``): kas' business only.
        upstream = {key: value for key, value in doc.configuration.items() if key not in _KAS_ONLY_SECTIONS}
        file = json_format.ParseDict(upstream, agentcfg_pb2.ConfigurationFile())
    except json_format.ParseError as exc:
        raise ConfigurationInvalid(str(exc)) from exc
    config = agentcfg_pb2.AgentConfiguration(
        agent_id=agent.agent_id,
        project_id=agent.project_id,
        project_path=doc.project_path,
        gitlab_external_url=external_url,
    )
    for name in _AGENT_FIELDS:
        if file.HasField(name):  # type: ignore[arg-type]
            getattr(config, name).CopyFrom(getattr(file, name))
    return config


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


class AgentConfigurationServicer(rpc_pb2_grpc.AgentConfigurationServicer):
    """Serves the configuration stream and tracks the connection it represents.

    Args:
        auth: resolves agent tokens.
        client: the hub's internal API.
        tracker: where connections are registered.
        poll_period_s: how often the hub is asked for a newer configuration, in seconds.
        max_connection_age_s: the stream ends with OK after about this long so agentk reconnects (kas.md §8.3).
        external_url: sent to agents as ``gitlab_external_url``.
        stopping: set on shutdown; open streams then end with OK at once.
    """

    def __init__(
        self,
        auth: AgentAuthenticator,
        client: GitlabClient,
        tracker: AgentTracker,
        poll_period_s: float,
        max_connection_age_s: float,
        external_url: str,
        stopping: asyncio.Event,
    ) -> None:
        self._auth = auth
        self._client = client
        self._tracker = tracker
        self._poll_s = poll_period_s
        self._max_age_s = max_connection_age_s
        self._external_url = external_url
        self._stopping = stopping
        self._pausing: set[asyncio.Future[None]] = set()
        self._waker: asyncio.Task[None] | None = None

    async def GetConfiguration(self, request: rpc_pb2.ConfigurationRequest, context: Any) -> None:  # type: ignore[override]
        """Stream configurations until the client leaves, the connection ages out or kas stops."""
        try:
            agent = await self._auth.authenticate(context.invocation_metadata())
        except AuthError as exc:
            await exc.abort(context)
        token = bearer_token(context.invocation_metadata())
        # agentk's own connection id when it sent one (Tether agentk), else a random one as upstream kas does.
        connection_id = current_connection_id() or random.getrandbits(63) or 1
        bind_for_task(connection_id=connection_id)
        commit_id = request.commit_id
        registered = None if request.skip_register else await self._register(request, connection_id, agent)
        del request  # this frame lives as long as the connection: the message (agent_meta) would too
        try:
            with self._auth.hold(context.invocation_metadata()):  # a revoked token's stream is cancelled
                await self._stream(commit_id, agent, token, context)
        except AuthError as exc:
            await self._forget_connections(agent)
            await context.abort(exc.code, exc.message)
        finally:
            if registered is not None:
                # The registration must go even when the stream was cancelled.
                with contextlib.suppress(Exception):
                    info = ConnectedAgentInfo.FromString(registered)
                    await asyncio.shield(self._tracker.unregister_connection(info))

    async def _register(self, request: rpc_pb2.ConfigurationRequest, connection_id: int, agent: AgentInfo) -> bytes:
        # Returns the registered ConnectedAgentInfo serialized: the stream keeps those bytes (about 100) for its
        # life instead of the message (about 850 bytes of protobuf arena), issue 9.
        connected_at = Timestamp()
        connected_at.GetCurrentTime()
        info = ConnectedAgentInfo(
            agent_meta=request.agent_meta,
            connected_at=connected_at,
            connection_id=connection_id,
            agent_id=agent.agent_id,
            project_id=agent.project_id,
        )
        await self._tracker.register_connection(info)
        return info.SerializeToString()

    async def _forget_connections(self, agent: AgentInfo) -> None:
        # The token was revoked or the agent deleted: its pods' Register entries (which only expire) go now,
        # so the hub stops listing them at once, as it does for stream registrations.
        try:
            removed = await self._tracker.unregister_agent(agent.agent_id)
        except Exception:
            log.exception("removing the connections of a refused agent failed", extra={"agent_id": agent.agent_id})
            return
        if removed:
            log.info("removed %d connections of a refused agent", removed, extra={"agent_id": agent.agent_id})

    async def _stream(self, last_commit: str, agent: AgentInfo, token: str, context: Any) -> None:
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + self._max_age_s * random.uniform(0.95, 1.0)
        backoff = Backoff(initial_s=10.0, max_s=60.0, factor=2.0, jitter=1.0, reset_after_s=120.0)
        while not self._stopping.is_set() and loop.time() < ends_at:
            wait_s = self._poll_s
            try:
                last_commit = await self._send_if_changed(last_commit, agent, token, context)
                backoff.reset()
            except GitlabClientError as exc:
                if exc.status_code in _FATAL:
                    self._auth.forget(token)
                    await self._forget_connections(agent)
                    await context.abort(_FATAL[exc.status_code], f"agent configuration: {exc.reason}")
                log.warning("agent configuration fetch failed: %s", exc, extra={"agent_id": agent.agent_id})
                wait_s = backoff.next_delay()
            except ConfigurationInvalid as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"invalid agent configuration: {exc}")
            except GitlabTimeout as exc:
                log.warning("agent configuration fetch failed: %s", exc)
                wait_s = backoff.next_delay()
            except (OSError, TimeoutError) as exc:
                log.warning("hub unreachable: %r", exc, extra={"agent_id": agent.agent_id})
                wait_s = backoff.next_delay()
            await self._pause(min(wait_s, max(ends_at - loop.time(), 0)))

    async def _pause(self, delay_s: float) -> None:
        # Every connected agent waits here between polls: a future and a timer each, woken early by one task
        # when kas stops (a timeout block around the stop event cost a Timeout object and an event waiter more
        # per agent, issue 9).
        if self._stopping.is_set():
            return
        loop = asyncio.get_running_loop()
        woken = loop.create_future()
        timer = loop.call_later(delay_s, _wake, woken)
        self._pausing.add(woken)
        if self._waker is None:
            self._waker = asyncio.create_task(self._wake_on_stop(), context=contextvars.Context())
        try:
            await woken
        finally:
            timer.cancel()
            self._pausing.discard(woken)

    async def _wake_on_stop(self) -> None:
        await self._stopping.wait()
        for woken in list(self._pausing):
            _wake(woken)

    async def _send_if_changed(self, last_commit: str, agent: AgentInfo, token: str, context: Any) -> str:
        # Its own frame: the fetched document and the message built from it are dropped before the stream
        # waits for the next poll, instead of living in the loop's frame for every connected agent.
        doc = await self._client.get_agent_configuration(token)
        if doc.commit_id != last_commit:
            config = agent_configuration(doc, agent, self._external_url)
            await context.write(rpc_pb2.ConfigurationResponse(configuration=config, commit_id=doc.commit_id))
            log.debug("sent agent configuration", extra={"commit_id": doc.commit_id})
        return doc.commit_id


class AgentConfigurationServerFactory:
    """kas half of ``agent_configuration``: ``GetConfiguration`` on the agent listener."""

    name = "agent_configuration"

    def new(self, api: ServerApi) -> Module:
        """Register ``AgentConfiguration`` on the agent listener."""
        config = api.config
        section = api.section(AgentConfigurationCF) or AgentConfigurationCF()
        rpc_pb2_grpc.add_AgentConfigurationServicer_to_server(
            AgentConfigurationServicer(
                api.auth,
                api.gitlab,
                api.agent_tracker,
                section.poll_period,
                api.long_poll_age_s,
                config.gitlab.external_url or config.gitlab.address,
                api.stopping,
            ),
            api.agent_server,
        )
        return IdleModule(self.name)
