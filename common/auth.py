"""Fleet and operator credentials: which RPC needs which role, and the gate that enforces it.

What it decides: for every incoming call, whether the bearer token in its ``authorization``
metadata grants the role the method needs (design section 6: a fleet credential for workers
and gateways, an operator credential for rollouts and drains). Rejections happen in a server
interceptor *before* the handler runs, so no servicer can forget a check:

* no token                         -> UNAUTHENTICATED, reason MISSING_CREDENTIALS
* a token that is neither role's   -> UNAUTHENTICATED, reason INVALID_CREDENTIALS
* a valid token of the wrong role  -> PERMISSION_DENIED, reason WRONG_ROLE

Why this shape: tokens are held only as SHA-256 digests and compared with
``hmac.compare_digest`` (no plaintext secrets in memory dumps, no timing oracle); the rules
map method names or service prefixes to a role so each server states its policy in one table.
Health and reflection are always open (probes and grpcurl need no secret); methods that no
rule names are open too, because the Infer servicer authenticates tenants itself.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any

import grpc
import grpc.aio

from common.errors import Reason, RichError, abort, permission_denied, unauthenticated

__all__ = [
    "ALWAYS_OPEN_PREFIXES",
    "DEV_FLEET_TOKEN",
    "DEV_OPERATOR_TOKEN",
    "FLEET_TOKEN_ENV",
    "OPERATOR_TOKEN_ENV",
    "AuthInterceptor",
    "AuthPolicy",
    "Role",
    "bearer_metadata",
    "token_from_env_or_default",
    "token_from_metadata",
]

DEV_FLEET_TOKEN = "dev-fleet-token"
DEV_OPERATOR_TOKEN = "dev-operator-token"
FLEET_TOKEN_ENV = "HALCYON_FLEET_TOKEN"
OPERATOR_TOKEN_ENV = "HALCYON_OPERATOR_TOKEN"

# Probes and grpcurl must work without a secret.
ALWAYS_OPEN_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


class Role(StrEnum):
    """Who a credential speaks for."""

    FLEET = "fleet"
    OPERATOR = "operator"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` the way :class:`AuthPolicy` reads it."""
    return (("authorization", f"Bearer {token}"),)


def token_from_env_or_default(value: str | None, env: str, default: str) -> tuple[str, bool]:
    """The token to use: ``value`` if given, else ``$env`` if set, else ``default``.

    Returns ``(token, is_dev_default)``; ``is_dev_default`` is true whenever the token in use
    equals the built-in dev default (however it was supplied), so callers can warn about it.
    """
    token = value or os.environ.get(env) or default
    return token, token == default


def token_from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The bearer token in ``authorization`` metadata, or None when absent or malformed."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return None
    return None


class AuthPolicy:
    """Maps full method names to the role they need; open methods need none."""

    def __init__(
        self, *, fleet_token: str, operator_token: str, rules: Mapping[str, Role | None]
    ) -> None:
        """``rules`` keys are ``/pkg.Service/`` prefixes or full ``/pkg.Service/Method`` names.

        A full name wins over a prefix; among prefixes the longest wins; ``None`` means open.
        """
        if not fleet_token or not operator_token:
            raise ValueError("fleet and operator tokens must be non-empty")
        for key in rules:
            if not key.startswith("/") or key.count("/") != 2:
                raise ValueError(f"rule key {key!r} is not '/pkg.Service/' or '/pkg.Service/M'")
        self._digests: tuple[tuple[bytes, Role], ...] = (
            (_digest(fleet_token), Role.FLEET),
            (_digest(operator_token), Role.OPERATOR),
        )
        self._exact = {k: v for k, v in rules.items() if not k.endswith("/")}
        # Longest prefix first, so "/a.S/" rules can be refined by longer ones if ever needed.
        self._prefixes = sorted(
            ((k, v) for k, v in rules.items() if k.endswith("/")),
            key=lambda kv: len(kv[0]),
            reverse=True,
        )

    def required_role(self, method: str) -> Role | None:
        """The role ``method`` (``/pkg.Service/Method``) needs, or None when it is open."""
        if method.startswith(ALWAYS_OPEN_PREFIXES):
            return None
        if method in self._exact:
            return self._exact[method]
        for prefix, role in self._prefixes:
            if method.startswith(prefix):
                return role
        return None

    def roles_of(self, token: str) -> frozenset[Role]:
        """Every role ``token`` grants (constant-time comparison against each digest)."""
        digest = _digest(token)
        granted = set()
        for known, role in self._digests:
            # Compare against every digest, always: the time taken does not say which matched.
            if hmac.compare_digest(digest, known):
                granted.add(role)
        return frozenset(granted)

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> RichError | None:
        """None when the call may proceed, else the rejection to send."""
        needed = self.required_role(method)
        if needed is None:
            return None
        token = token_from_metadata(metadata)
        if token is None:
            return unauthenticated(
                f"{method} needs the {needed} credential as 'authorization: Bearer <token>'",
                Reason.MISSING_CREDENTIALS,
            )
        roles = self.roles_of(token)
        if not roles:
            return unauthenticated(
                "the bearer token is not a known credential", Reason.INVALID_CREDENTIALS
            )
        if needed not in roles:
            err = permission_denied(
                f"{method} needs the {needed} credential; this token is {'/'.join(sorted(roles))}",
                Reason.WRONG_ROLE,
            )
            err.metadata = {"method": method, "required_role": str(needed)}
            return err
        return None


def _rejecting_handler(handler: grpc.RpcMethodHandler, err: RichError) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that only aborts with ``err``."""

    async def reject(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, err)

    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject, **kwargs)
    return grpc.unary_unary_rpc_method_handler(reject, **kwargs)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects calls per an :class:`AuthPolicy` before their handler runs."""

    def __init__(self, policy: AuthPolicy) -> None:
        self._policy = policy

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        err = self._policy.check(
            handler_call_details.method, handler_call_details.invocation_metadata
        )
        return handler if err is None else _rejecting_handler(handler, err)
