"""Service JWTs signed once a second and verified once per token (issue 28): same tokens, same refusals."""

from __future__ import annotations

import types
from datetime import UTC, datetime

import jwt
import pytest

from tether.tool import jwt_auth
from tether.tool.jwt_auth import (
    AUDIENCE_GITLAB,
    AUDIENCE_KAS,
    ISSUER_KAS,
    JwtError,
    JwtVerifier,
    RecentTokens,
    SecondSigner,
    mint,
    verify,
)

SECRET = b"s" * 32
START = 1_800_000_000.25


class Clock:
    """One clock for Tether's checks and PyJWT's own (it reads ``datetime.now``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = START
        monkeypatch.setattr(jwt_auth, "time", types.SimpleNamespace(time=lambda: self.now))
        clock = self

        class FrozenDatetime(datetime):
            @classmethod
            def now(cls, tz: object = None) -> FrozenDatetime:  # type: ignore[override]
                return cls.fromtimestamp(clock.now, tz=UTC)

        monkeypatch.setattr(jwt.api_jwt, "datetime", FrozenDatetime)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def test_signer_gives_the_token_mint_gives_in_that_second(clock: Clock) -> None:
    signer = SecondSigner(SECRET, ISSUER_KAS, AUDIENCE_KAS, 5.0)
    first = signer.token()
    assert first == mint(SECRET, ISSUER_KAS, AUDIENCE_KAS, 5.0, now=clock.now)
    clock.now += 0.7
    assert signer.token() == first
    clock.now += 0.1  # the next second
    second = signer.token()
    assert second != first
    assert verify(second, SECRET, AUDIENCE_KAS, ISSUER_KAS)["iat"] == int(clock.now)


def test_a_remembered_token_expires_as_it_would_unremembered(clock: Clock) -> None:
    tokens = RecentTokens(SECRET, AUDIENCE_KAS, ISSUER_KAS)
    token = mint(SECRET, ISSUER_KAS, AUDIENCE_KAS, 5.0, now=clock.now)
    tokens.check(token)
    assert len(tokens) == 1
    clock.now = int(START) + 5 + 4.9  # exp + leeway not yet reached
    tokens.check(token)
    clock.now = int(START) + 5 + 5.1
    with pytest.raises(JwtError, match="expired"):
        tokens.check(token)


@pytest.mark.parametrize(
    ("secret", "audience", "issuer"),
    [(b"t" * 32, AUDIENCE_KAS, ISSUER_KAS), (SECRET, AUDIENCE_GITLAB, ISSUER_KAS), (SECRET, AUDIENCE_KAS, "gitlab")],
    ids=["other secret", "other audience", "other issuer"],
)
def test_a_remembered_token_does_not_open_another_checker(
    clock: Clock, secret: bytes, audience: str, issuer: str
) -> None:
    token = mint(secret, issuer, audience, 5.0, now=clock.now)
    RecentTokens(secret, audience, issuer).check(token)
    with pytest.raises(JwtError):
        RecentTokens(SECRET, AUDIENCE_KAS, ISSUER_KAS).check(token)


def test_a_stranger_cannot_fill_the_store(clock: Clock) -> None:
    tokens = RecentTokens(SECRET, AUDIENCE_KAS, ISSUER_KAS, capacity=8)
    good = mint(SECRET, ISSUER_KAS, AUDIENCE_KAS, 5.0, now=clock.now)
    tokens.check(good)
    forged = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
    for token in [forged, *(mint(b"x" * 32, ISSUER_KAS, AUDIENCE_KAS, 5.0, now=clock.now + i) for i in range(100))]:
        with pytest.raises(JwtError):
            tokens.check(token)
    assert len(tokens) == 1
    for i in range(1, 20):  # valid tokens beyond the capacity empty the store rather than grow it
        tokens.check(mint(SECRET, ISSUER_KAS, AUDIENCE_KAS, 5.0, now=clock.now + i / 100, extra={"n": i}))
        assert len(tokens) <= 8


def test_listener_verifier_refuses_what_it_refused_before(clock: Clock) -> None:
    verifier = JwtVerifier(SECRET, AUDIENCE_KAS, ISSUER_KAS)
    token = mint(SECRET, ISSUER_KAS, AUDIENCE_KAS, 5.0, now=clock.now)
    for _ in range(3):
        verifier.check_metadata([("authorization", f"Bearer {token}")])
    with pytest.raises(JwtError, match="missing or malformed"):
        verifier.check_metadata([("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")])
    with pytest.raises(JwtError):
        verifier.check_metadata([("authorization", f"Bearer {token}x")])
    clock.now += 11
    with pytest.raises(JwtError, match="expired"):
        verifier.check_metadata([("authorization", f"Bearer {token}")])
