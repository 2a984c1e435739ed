"""Who may call which method: the method table, and the gate that enforces it.

What it decides: for every incoming call, whether it may reach its handler. Every method of
every service Halcyon serves is named in :data:`METHOD_ACCESS` with what it needs:

* :attr:`Access.PUBLIC`   — nothing (health probes, reflection for grpcurl);
* :attr:`Access.TENANT`   — a tenant API key, which the servicer checks itself (``Infer``:
  tenants, quotas and priorities are the gateway's business, not a role);
* :attr:`Access.FLEET`    — the fleet credential (workers and gateways);
* :attr:`Access.OPERATOR` — the operator credential (state, rollouts, drains).

The gate is **fail-closed**: a method no rule names is refused (``PERMISSION_DENIED /
UNLISTED_METHOD``) even though a handler exists, and :meth:`AuthPolicy.unlisted` lets a host
refuse to start while any method it serves is missing from the table. Rejections happen
*before* the handler runs — for unary methods in the unary pipeline's auth layer
(:meth:`AuthPolicy.layer_for`, ``common.pipeline``), for streaming methods in
:class:`AuthInterceptor`; both ask :meth:`AuthPolicy.check` — so no servicer can forget one:

* no token                         -> UNAUTHENTICATED, reason MISSING_CREDENTIALS
* a token that is neither role's   -> UNAUTHENTICATED, reason INVALID_CREDENTIALS
* a valid token of the wrong role  -> PERMISSION_DENIED, reason WRONG_ROLE

Why this shape: tokens are held only as SHA-256 digests and compared with
``hmac.compare_digest`` against every known digest (no plaintext secret in memory dumps, no
timing oracle); full method names only, no prefixes, so a method added to a service later is
refused until someone decides who may call it. Where the secrets come from (files, the
environment, development mode) is :mod:`common.credentials`' business.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any

import grpc
import grpc.aio

from common.call import UnaryCall, Verdict
from common.errors import Reason, RichError, abort, permission_denied, unauthenticated
from common.handlers import same_kind_handler
from common.pipeline import Layer

__all__ = [
    "METHOD_ACCESS",
    "STANDARD_ACCESS",
    "Access",
    "AuthInterceptor",
    "AuthPolicy",
    "Role",
    "TenantCheck",
    "bearer_metadata",
    "token_from_metadata",
]


class Access(StrEnum):
    """What a method needs before its handler runs."""

    PUBLIC = "public"
    TENANT = "tenant"
    FLEET = "fleet"
    OPERATOR = "operator"


# The credential roles (the accesses a bearer token can grant).
Role = Access
_ROLES = (Access.FLEET, Access.OPERATOR)

_CONTROL = "/halcyon.v1.ControlService/"
_WORKER = "/halcyon.v1.WorkerService/"

# Health and reflection: every host serves them, probes and grpcurl need no secret.
STANDARD_ACCESS: Mapping[str, Access] = {
    "/grpc.health.v1.Health/Check": Access.PUBLIC,
    "/grpc.health.v1.Health/Watch": Access.PUBLIC,
    "/grpc.health.v1.Health/List": Access.PUBLIC,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": Access.PUBLIC,
}

# Every method Halcyon serves. A test enumerates the services' descriptors against it.
METHOD_ACCESS: Mapping[str, Access] = {
    **STANDARD_ACCESS,
    "/halcyon.v1.InferService/Infer": Access.TENANT,
    f"{_CONTROL}GetState": Access.OPERATOR,
    f"{_CONTROL}StartRollout": Access.OPERATOR,
    f"{_CONTROL}PromoteRollout": Access.OPERATOR,
    f"{_CONTROL}AbortRollout": Access.OPERATOR,
    f"{_CONTROL}PauseRollout": Access.OPERATOR,
    f"{_CONTROL}ResumeRollout": Access.OPERATOR,
    f"{_CONTROL}ApproveRollout": Access.OPERATOR,
    f"{_CONTROL}ListRolloutDecisions": Access.OPERATOR,
    f"{_CONTROL}WatchRolloutDecisions": Access.OPERATOR,
    f"{_CONTROL}DrainReplica": Access.OPERATOR,
    f"{_CONTROL}UndrainReplica": Access.OPERATOR,
    f"{_CONTROL}WorkerSession": Access.FLEET,
    f"{_CONTROL}WatchFleet": Access.FLEET,
    f"{_CONTROL}ReportOutcomes": Access.FLEET,
    f"{_WORKER}ExecuteBatch": Access.FLEET,
    f"{_WORKER}Drain": Access.FLEET,
    f"{_WORKER}Undrain": Access.FLEET,
    f"{_WORKER}Describe": Access.FLEET,
}


# A TENANT method's credential check, given by the service that knows its tenants: (the
# call, its request not yet decoded) -> the rejection, or None when it carries a tenant key.
TenantCheck = Callable[[UnaryCall], RichError | None]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` the way :class:`AuthPolicy` reads it."""
    return (("authorization", f"Bearer {token}"),)


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


def _is_full_method(method: str) -> bool:
    return method.startswith("/") and method.count("/") == 2 and not method.endswith("/")


class AuthPolicy:
    """The credentials a server knows (as digests) and the access every method needs."""

    def __init__(
        self,
        *,
        fleet_token: str | None,
        operator_token: str | None,
        rules: Mapping[str, Access] = METHOD_ACCESS,
    ) -> None:
        """``rules`` maps full ``/pkg.Service/Method`` names to their access; the standard
        health and reflection methods (:data:`STANDARD_ACCESS`) are always included.

        A credential that is None is not known to this server: a token equal to it is
        rejected as INVALID_CREDENTIALS, and a method that needs it can never be called.
        """
        for key in rules:
            if not _is_full_method(key):
                raise ValueError(f"rule key {key!r} is not a full method name '/pkg.Service/M'")
        if fleet_token is not None and fleet_token == operator_token:
            raise ValueError("the fleet and operator credentials must differ")
        known: list[tuple[bytes, Access]] = []
        for token, role in ((fleet_token, Access.FLEET), (operator_token, Access.OPERATOR)):
            if token is None:
                continue
            if not token.strip():
                raise ValueError(f"the {role} credential must not be empty")
            known.append((_digest(token), role))
        self._digests = tuple(known)
        self._rules: dict[str, Access] = {**STANDARD_ACCESS, **rules}

    def required(self, method: str) -> Access | None:
        """What ``method`` needs, or None when no rule names it (it is then refused)."""
        return self._rules.get(method)

    def unlisted(self, methods: Iterable[str]) -> list[str]:
        """The methods among ``methods`` that no rule names."""
        return [m for m in methods if m not in self._rules]

    def roles_of(self, token: str) -> frozenset[Access]:
        """Every role ``token`` grants (constant-time comparison against each digest)."""
        digest = _digest(token)
        granted = set()
        for known, role in self._digests:
            # Compare against every digest, always: the time taken does not say which matched.
            if hmac.compare_digest(digest, known):
                granted.add(role)
        return frozenset(granted)

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> RichError | None:
        """None when the call may proceed to its handler, else the rejection to send."""
        needed = self._rules.get(method)
        if needed is Access.PUBLIC or needed is Access.TENANT:
            return None  # tenant keys are checked by the servicer, which knows the tenants
        if needed is None:
            err = permission_denied(
                f"no authorization rule names {method}: this server refuses methods it has no "
                "rule for (fail-closed)",
                Reason.UNLISTED_METHOD,
            )
            err.metadata = {"method": method}
            return err
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

    def layer_for(self, method: str, tenant_check: TenantCheck | None = None) -> Layer | None:
        """The pipeline's auth layer for ``method``, or None when nothing needs checking: a
        public method, or a tenant method whose service gave no ``tenant_check``."""
        needed = self._rules.get(method)
        if needed is Access.PUBLIC:
            return None
        if needed is Access.TENANT:
            return None if tenant_check is None else _TenantAuth(tenant_check)
        return _MethodAuth(self, method)


class _MethodAuth(Layer):
    """A role-checked (or unlisted) method: :meth:`AuthPolicy.check` per call."""

    def __init__(self, policy: AuthPolicy, method: str) -> None:
        self._check = policy.check
        self._method = method

    def admit(self, call: UnaryCall) -> Verdict:
        return self._check(self._method, call.metadata)


class _TenantAuth(Layer):
    """A tenant method: its service's check of the tenant key, before the request is read."""

    def __init__(self, check: TenantCheck) -> None:
        self._check = check

    def admit(self, call: UnaryCall) -> Verdict:
        return self._check(call)


def _rejecting_handler(handler: grpc.RpcMethodHandler, err: RichError) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that only aborts with ``err``."""

    async def reject(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, err)

    return same_kind_handler(handler, reject)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects streaming calls per an :class:`AuthPolicy` before their handler runs."""

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
