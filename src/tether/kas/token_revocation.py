"""Agent token revocation across every kas (issue 9 item 7; a Tether addition, upstream waits for its cache).

The hub calls ``AgentTokens/RevokeAgentTokens`` on kas' api listener with the SHA-256 digests of the revoked
tokens (it keeps nothing else). That kas publishes ``AgentTokenRevoked`` on the event bus; every kas, the
publisher included, receives it and calls ``AgentAuthenticator.revoke``: the tokens are forgotten and refused,
and the tunnels and configuration streams opened with them are cancelled.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from tether.modserver.agent_auth import AgentAuthenticator
from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.event.event_pb2 import AgentTokenRevoked
from tether.tool.events import EventBus

__all__ = ["AgentTokensServicer", "subscribe_revocations"]

log = logging.getLogger(__name__)

#: Most digests one call may carry (an agent has a handful of tokens; this bounds the event size).
MAX_DIGESTS = 1000


class AgentTokensServicer(rpc_pb2_grpc.AgentTokensServicer):
    """Serves ``/gitlab.agent.agent_tokens.rpc.AgentTokens/RevokeAgentTokens`` (JWT checked by the listener).

    Args:
        events: the bus every kas listens on.
    """

    def __init__(self, events: EventBus) -> None:
        self._events = events

    async def RevokeAgentTokens(
        self, request: rpc_pb2.RevokeAgentTokensRequest, context: Any
    ) -> rpc_pb2.RevokeAgentTokensResponse:
        """Publish the revocation to every kas.

        Raises:
            grpc.aio.AbortError: INVALID_ARGUMENT for a digest that is not 32 bytes or too many digests;
                UNAVAILABLE when the event cannot be published.
        """
        if len(request.token_sha256) > MAX_DIGESTS or any(len(d) != 32 for d in request.token_sha256):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"token_sha256: at most {MAX_DIGESTS} SHA-256 digests of 32 bytes"
            )
        event = AgentTokenRevoked(agent_id=request.agent_id, token_sha256=request.token_sha256)
        try:
            await self._events.publish(event)
        except Exception as exc:
            log.warning("publishing a token revocation failed: %r", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the revocation could not be published to every kas")
        return rpc_pb2.RevokeAgentTokensResponse()


def subscribe_revocations(events: EventBus, auth: AgentAuthenticator) -> None:
    """Apply every ``AgentTokenRevoked`` event of the bus to ``auth``."""

    def apply(event: AgentTokenRevoked) -> None:
        cancelled = auth.revoke(event.token_sha256)
        log.info(
            "agent tokens revoked",
            extra={"agent_id": event.agent_id, "tokens": len(event.token_sha256), "rpcs_closed": cancelled},
        )

    events.on(AgentTokenRevoked, apply)
