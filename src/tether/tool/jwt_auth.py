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
from dataclasses import dataclass
from typing import Any

import grpc
import jwt

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


@dataclass(frozen=True)
class JwtVerifier:
    """Checks ``authorization: Bearer <JWT>`` metadata for one listener.

    Attributes:
        secret: HMAC key.
        audience: required ``aud``.
        issuer: required ``iss``, or None to accept any issuer.
    """

    secret: bytes
    audience: str
    issuer: str | None

    def check_metadata(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
        """Raise :class:`JwtError` unless exactly one valid bearer JWT is in ``metadata``."""
        values = [v for k, v in metadata or () if k == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str) or not values[0].startswith("Bearer "):
            raise JwtError("missing or malformed authorization metadata (want: Bearer <JWT>)")
        verify(values[0].removeprefix("Bearer "), self.secret, self.audience, self.issuer)


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


def reject_handler(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A method handler ending any call with ``code``/``message`` before reading or decoding a request."""

    async def abort(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, message)

    # On the wire every call is a stream, so a stream handler answers unary callers too, before any read.
    return grpc.stream_stream_rpc_method_handler(abort)
