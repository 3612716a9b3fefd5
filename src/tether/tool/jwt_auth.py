"""HS256 JWTs between services (kas.md §4.2-4.4, seed 000 "JWT issuer should be gitlab ...").

Who signs what:

* hub -> kas api listener: ``iss=gitlab``, ``aud=gitlab-kas``, the api secret;
* kas -> kas private api: ``iss=aud=gitlab-kas``, a secret only kas instances share, 5 s lifetime;
* kas -> hub internal API: ``iss=gitlab-kas``, ``aud=gitlab``, header ``Gitlab-Kas-Api-Request``, 30 s;
* the workspaces' sign-in (``tether.modules.workspace_access.rpc.tokens``): other audiences, same gitlab secret.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import jwt

from tether.tool.grpc_reject import reject_handler

ISSUER_GITLAB = "gitlab"
ISSUER_KAS = "gitlab-kas"
AUDIENCE_KAS = "gitlab-kas"
AUDIENCE_GITLAB = "gitlab"
_ALGORITHMS = ["HS256", "HS384", "HS512"]
_LEEWAY_S = 5.0


class JwtError(ValueError):
    """A token failed validation; the message says why (expired, wrong audience, bad signature...)."""


def mint(
    secret: bytes,
    issuer: str,
    audience: str,
    lifetime_s: float,
    now: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Sign a HS256 token valid from ``now - 5 s`` for ``lifetime_s`` seconds (kas.md §4.3).

    Args:
        secret: HMAC key.
        issuer: ``iss``, e.g. ``gitlab-kas``.
        audience: ``aud``, e.g. ``gitlab``.
        lifetime_s: seconds from ``now`` to ``exp``.
        now: Unix time in seconds; None for the current time.
        extra: further claims (they cannot replace the standard ones).
    """
    now = time.time() if now is None else now
    claims = {**(extra or {}), "iss": issuer, "aud": audience, "iat": int(now), "nbf": int(now - 5)}
    claims["exp"] = int(now + lifetime_s)
    return jwt.encode(claims, secret, algorithm="HS256")


def verify(token: str, secret: bytes, audience: str, issuer: str | None) -> dict[str, Any]:
    """Validate signature, ``exp``/``nbf`` (5 s leeway), audience and, when given, issuer.

    Raises:
        JwtError: with the reason.
    """
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=_ALGORITHMS,
            audience=audience,
            issuer=issuer,
            leeway=_LEEWAY_S,
            options={"require": ["exp", "aud"]},
        )
    except jwt.PyJWTError as exc:
        raise JwtError(str(exc)) from exc
    return claims


class SecondSigner:
    """Signs a service's per-call bearer JWT once a second (kas.md §4.3-4.4: a fresh token on every call).

    Claims are whole seconds, so every token :func:`mint` makes within one second is the same string: signing it
    once a second gives each call the token a per-call :func:`mint` would have (22 µs of HMAC and JSON per call
    saved; issue 28). ``exp`` is the second's start plus ``lifetime_s``.

    Args:
        secret: HMAC key.
        issuer: ``iss``.
        audience: ``aud``.
        lifetime_s: seconds from the current second to ``exp``.
    """

    __slots__ = ("_audience", "_issuer", "_lifetime_s", "_second", "_secret", "_token")

    def __init__(self, secret: bytes, issuer: str, audience: str, lifetime_s: float) -> None:
        self._secret = secret
        self._issuer = issuer
        self._audience = audience
        self._lifetime_s = lifetime_s
        self._second = -1
        self._token = ""

    def token(self) -> str:
        """The token of the current second (Unix time, whole seconds)."""
        second = int(time.time())
        if second != self._second:
            self._token = mint(self._secret, self._issuer, self._audience, self._lifetime_s, now=second)
            self._second = second
        return self._token


class RecentTokens:
    """Service tokens that passed :func:`verify` lately, so a sender's token is verified once, not on every call.

    Senders sign once a second (:class:`SecondSigner`), so a listener sees one token per sender and second; each
    full verification cost 46 µs (issue 28: a kas -> kas call verified one, the hub one per kas call). A hit is
    an exact match of a token verified with this object's secret, audience and issuer, and its ``exp`` is checked
    again (same leeway), so a stored token expires as it would unstored. Only tokens that passed are stored, at
    most ``capacity``; the store is emptied when full, so no caller can grow it.

    Args:
        secret: HMAC key.
        audience: required ``aud``.
        issuer: required ``iss``, or None to accept any issuer.
        capacity: most tokens kept.
    """

    def __init__(self, secret: bytes, audience: str, issuer: str | None, capacity: int = 64) -> None:
        self._secret = secret
        self._audience = audience
        self._issuer = issuer
        self._capacity = capacity
        self._expiry: dict[str, float] = {}

    def __len__(self) -> int:
        """Tokens held."""
        return len(self._expiry)

    def check(self, token: str) -> None:
        """Return when ``token`` is valid now.

        Raises:
            JwtError: with the reason, as :func:`verify`.
        """
        expiry = self._expiry.get(token)
        if expiry is not None and time.time() < expiry:
            return
        claims = verify(token, self._secret, self._audience, self._issuer)
        exp = claims["exp"]
        if isinstance(exp, int | float):  # PyJWT also takes an exp that int() reads, e.g. "17e8"; only numbers are kept
            if len(self._expiry) >= self._capacity:
                self._expiry.clear()
            self._expiry[token] = float(exp) + _LEEWAY_S


class JwtVerifier(RecentTokens):
    """Checks ``authorization: Bearer <JWT>`` metadata for one listener (kas.md §4.2-4.3), as :class:`RecentTokens`.

    Args:
        secret: HMAC key.
        audience: required ``aud``.
        issuer: required ``iss``, or None to accept any issuer.
    """

    def check_metadata(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
        """Raise :class:`JwtError` unless exactly one valid bearer JWT is in ``metadata``."""
        values = [v for k, v in metadata or () if k == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str) or not values[0].startswith("Bearer "):
            raise JwtError("missing or malformed authorization metadata (want: Bearer <JWT>)")
        self.check(values[0].removeprefix("Bearer "))


class JwtServerInterceptor(grpc.aio.ServerInterceptor):
    """Rejects every RPC on a listener whose bearer JWT does not validate, with ``UNAUTHENTICATED``.

    The message is upstream's "JWT validation failed" plus the reason (kas.md §4.2).
    """

    def __init__(self, verifier: JwtVerifier) -> None:
        self._verifier = verifier

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Check the caller's JWT before the method handler is looked up."""
        try:
            self._verifier.check_metadata(handler_call_details.invocation_metadata)
        except JwtError as exc:
            return reject_handler(grpc.StatusCode.UNAUTHENTICATED, f"JWT validation failed: {exc}")
        return await continuation(handler_call_details)
