"""What request handlers share: the database, the secrets, the kas client and the configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from tether.hub.api.throttle import FailedAuthThrottle
from tether.hub.config import HubConfig
from tether.hub.db.engine import Database
from tether.hub.kas_client import KasApiClient
from tether.hub.service.revocation_outbox import RevocationSweeper
from tether.hub.service.token_use import TokenUseWriter
from tether.tool.jwt_auth import AUDIENCE_GITLAB, ISSUER_KAS, RecentTokens


@dataclass
class HubState:
    """Process-wide state, stored in ``app.state.hub`` by the app's lifespan.

    Attributes:
        config: the configuration.
        db: the database.
        gitlab_secret: the internal API JWT secret (32 bytes).
        kas: the client of kas' api listener, or None when ``kas.api_address`` is not configured.
        gitaly_token: the token of the Gitaly-compatible service, sent to kas in ``agent_info``.
        throttle: failed authentications per client address.
        token_uses: agent tokens' ``last_used_at``, written in batches.
        revocations: the revocation outbox's sweeper (it also knows which deliveries this replica holds), or None
            without ``kas.api_address``.
        kas_jwt: the checker of kas' JWTs on the internal API (``iss=gitlab-kas``, ``aud=gitlab``, kas.md §4.4).
    """

    config: HubConfig
    db: Database
    gitlab_secret: bytes
    kas: KasApiClient | None
    throttle: FailedAuthThrottle
    token_uses: TokenUseWriter
    gitaly_token: str = ""
    revocations: RevocationSweeper | None = None
    kas_jwt: RecentTokens = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.kas_jwt = RecentTokens(self.gitlab_secret, AUDIENCE_GITLAB, ISSUER_KAS)


def hub_state(request: Request) -> HubState:
    """The state of the app serving ``request``."""
    state: HubState = request.app.state.hub
    return state
