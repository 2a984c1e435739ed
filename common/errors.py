"""Rich gRPC errors: how every Halcyon rejection is expressed, sent and read back.

What it decides: the one mapping between a rejection (a :class:`RichError` raised by policy
or servicer code) and the wire form of the gRPC rich error model — a ``google.rpc.Status``
carried in the ``grpc-status-details-bin`` trailer with ``ErrorInfo`` (reason + domain +
metadata), ``RetryInfo``, ``BadRequest`` and ``QuotaFailure`` details — plus the
``grpc-retry-pushback-ms`` trailer that gRPC's own retry machinery understands.

Why one module: the design (section 3) requires retry advice on every rejection where
retrying later can work, and reasons a client can switch on; keeping the encoding in one
place means servicers cannot drift apart, and clients and tests read rejections with the same
code that wrote them. Constructors here compute nothing: callers pass the computed retry
delay (refill time, predicted drain), never a constant chosen here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from common.durations import to_duration, to_seconds

__all__ = [
    "DETAILS_KEY",
    "DOMAIN",
    "NO_RETRY_PUSHBACK",
    "PUSHBACK_KEY",
    "FieldViolation",
    "QuotaViolation",
    "Reason",
    "RichError",
    "abort",
    "abort_sync",
    "deadline_missed",
    "deadline_unreachable",
    "echo",
    "internal",
    "invalid_argument",
    "not_found_model",
    "parse_rpc_error",
    "permission_denied",
    "quota_exceeded",
    "unauthenticated",
    "unavailable",
    "undecodable",
]

DOMAIN = "halcyon.dev"
DETAILS_KEY = "grpc-status-details-bin"
PUSHBACK_KEY = "grpc-retry-pushback-ms"
# gRFC A6: a negative pushback means "do not retry this call".
NO_RETRY_PUSHBACK = "-1"
# ErrorInfo metadata key under which deadline_unreachable carries its prediction.
PREDICTED_COMPLETION_MS = "predicted_completion_ms"
# ... and the time that was left to the deadline it was compared with.
DEADLINE_MS = "deadline_ms"
# The most characters of a client's string any message or detail repeats (see echo()).
ECHO_CHARS = 128
# ... and the most characters of one field violation's description.
DESCRIPTION_CHARS = 512


class Reason(StrEnum):
    """``ErrorInfo.reason`` values in the ``halcyon.dev`` domain: what a client switches on."""

    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    OVERLOADED = "OVERLOADED"
    QUEUE_FULL = "QUEUE_FULL"
    NO_CAPACITY = "NO_CAPACITY"
    DEADLINE_UNREACHABLE = "DEADLINE_UNREACHABLE"
    # Queued work evicted because it can no longer make its deadline.
    DEADLINE_MISSED = "DEADLINE_MISSED"
    REPLICA_BUSY = "REPLICA_BUSY"
    REPLICA_DRAINING = "REPLICA_DRAINING"
    UNKNOWN_MODEL = "UNKNOWN_MODEL"
    INVALID_FIELD = "INVALID_FIELD"
    MISSING_CREDENTIALS = "MISSING_CREDENTIALS"
    INVALID_CREDENTIALS = "INVALID_CREDENTIALS"
    WRONG_ROLE = "WRONG_ROLE"
    # A method no authorization rule names: refused (fail-closed).
    UNLISTED_METHOD = "UNLISTED_METHOD"
    UPSTREAM_FAILURE = "UPSTREAM_FAILURE"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    ROLLOUT_CONFLICT = "ROLLOUT_CONFLICT"
    # Rollout preconditions: no rollout running, no baseline, no canary replica, store down.
    NO_ACTIVE_ROLLOUT = "NO_ACTIVE_ROLLOUT"
    NO_STABLE_VERSION = "NO_STABLE_VERSION"
    NO_CANARY_REPLICA = "NO_CANARY_REPLICA"
    # Rollout gates (issue #20): pause a paused one, resume a running one, approve when
    # nothing waits, promote a dry run.
    ROLLOUT_ALREADY_PAUSED = "ROLLOUT_ALREADY_PAUSED"
    ROLLOUT_NOT_PAUSED = "ROLLOUT_NOT_PAUSED"
    ROLLOUT_NOT_AWAITING_APPROVAL = "ROLLOUT_NOT_AWAITING_APPROVAL"
    ROLLOUT_ANALYSIS_ONLY = "ROLLOUT_ANALYSIS_ONLY"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    # A standby controller (issue #22): only the leader acts; metadata "leader" names it.
    NOT_LEADER = "NOT_LEADER"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    SESSION_REPLACED = "SESSION_REPLACED"
    # A registration under a replica id whose session is still live.
    REPLICA_ID_IN_USE = "REPLICA_ID_IN_USE"
    # A request message above the size the server reads.
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    UNKNOWN_REPLICA = "UNKNOWN_REPLICA"
    DEVICE_FAULT = "DEVICE_FAULT"
    WRONG_MODEL = "WRONG_MODEL"
    INTERNAL = "INTERNAL"  # a bug on our side, answered instead of UNKNOWN


@dataclass(frozen=True)
class FieldViolation:
    """One ``BadRequest.FieldViolation``: which request field is wrong and why."""

    field: str
    description: str


@dataclass(frozen=True)
class QuotaViolation:
    """One ``QuotaFailure.Violation``: whose quota ran out (e.g. ``tenant:acme``) and why."""

    subject: str
    description: str


# eq=False: exceptions keep identity equality and stay hashable (a mutable dataclass with
# eq=True would set __hash__ to None, which breaks code that puts exceptions in sets).
@dataclass(eq=False)
class RichError(Exception):
    """A rejection with everything the client needs to react: code, reason, retry advice.

    Raise it from policy or servicer code; the servicer boundary turns it into a status with
    :func:`abort`. Clients get it back with :func:`parse_rpc_error`.
    """

    code: grpc.StatusCode
    message: str
    reason: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    retry_after_s: float | None = None
    field_violations: list[FieldViolation] = field(default_factory=list)
    quota_violations: list[QuotaViolation] = field(default_factory=list)
    domain: str = DOMAIN

    def __post_init__(self) -> None:
        if self.code == grpc.StatusCode.OK:
            raise ValueError("a RichError cannot carry StatusCode.OK")
        if self.retry_after_s is not None and not (
            math.isfinite(self.retry_after_s) and self.retry_after_s >= 0.0
        ):
            raise ValueError(f"retry_after_s must be finite and >= 0, got {self.retry_after_s}")
        # Exception.args = (code, message) keeps str(), repr() of args and pickling sensible:
        # BaseException.__reduce__ rebuilds with cls(*args) and then restores __dict__.
        Exception.__init__(self, self.code, self.message)

    def __str__(self) -> str:
        head = f"{self.code.name}: {self.message}"
        return f"{head} [{self.reason}]" if self.reason else head

    # -- to the wire --------------------------------------------------------------------------

    def to_proto(self) -> status_pb2.Status:
        """The ``google.rpc.Status`` message with every applicable detail packed in."""
        details: list[Any] = []
        if self.reason is not None:
            details.append(
                error_details_pb2.ErrorInfo(
                    reason=str(self.reason), domain=self.domain, metadata=self.metadata
                )
            )
        if self.retry_after_s is not None:
            delay = to_duration(self.retry_after_s)
            details.append(error_details_pb2.RetryInfo(retry_delay=delay))
        if self.field_violations:
            details.append(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=v.field, description=v.description
                        )
                        for v in self.field_violations
                    ]
                )
            )
        if self.quota_violations:
            details.append(
                error_details_pb2.QuotaFailure(
                    violations=[
                        error_details_pb2.QuotaFailure.Violation(
                            subject=v.subject, description=v.description
                        )
                        for v in self.quota_violations
                    ]
                )
            )
        packed = []
        for detail in details:
            any_msg = any_pb2.Any()
            any_msg.Pack(detail)
            packed.append(any_msg)
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=packed)

    def pushback_ms(self) -> int | None:
        """The ``grpc-retry-pushback-ms`` value: the retry delay rounded up to whole ms."""
        if self.retry_after_s is None:
            return None
        # Via integer nanoseconds (as RetryInfo carries it), so 0.07 s is 70 ms, not the 71 a
        # float ceil(0.07 * 1000 = 70.00000000000001) would give.
        nanos = round(self.retry_after_s * 1e9)
        return -(-nanos // 1_000_000)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """Trailers to send: the serialized status, and the pushback hint when retryable.

        (The details entry is binary, as gRPC requires of ``-bin`` keys.) Remembered for
        errors without violations: under overload one refusal repeats thousands of times a
        second with the same figures, and building its status was 13 % of the gateway's CPU
        in a retry storm.
        """
        if self.field_violations or self.quota_violations:
            return self._build_trailers()
        return _remembered_trailers(
            self.code,
            self.message,
            self.reason,
            tuple(self.metadata.items()),
            self.retry_after_s,
            self.domain,
        )

    def _build_trailers(self) -> tuple[tuple[str, str | bytes], ...]:
        trailers: list[tuple[str, str | bytes]] = [
            (DETAILS_KEY, self.to_proto().SerializeToString())
        ]
        pushback = self.pushback_ms()
        if pushback is not None:
            trailers.append((PUSHBACK_KEY, str(pushback)))
        elif self.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            # Retryable by code, but nothing says waiting helps (a message over the size
            # limit): a negative pushback tells gRPC's retry not to try again (gRFC A6).
            trailers.append((PUSHBACK_KEY, NO_RETRY_PUSHBACK))
        return tuple(trailers)

    def to_status(self) -> grpc.Status:
        """A ``grpc.Status`` for ``context.abort_with_status``, carrying all trailers."""
        status = rpc_status.to_status(self.to_proto())
        return status._replace(trailing_metadata=self.trailing_metadata())


@functools.lru_cache(maxsize=1024)
def _remembered_trailers(
    code: grpc.StatusCode,
    message: str,
    reason: str | None,
    metadata: tuple[tuple[str, str], ...],
    retry_after_s: float | None,
    domain: str,
) -> tuple[tuple[str, str | bytes], ...]:
    error = RichError(code, message, reason, dict(metadata), retry_after_s, domain=domain)
    return error._build_trailers()


# -- constructors for the common cases --------------------------------------------------------


def echo(value: str, limit: int = ECHO_CHARS) -> str:
    """``value`` as a message or detail may repeat it: at most ``limit`` characters, a longer
    one cut with an ellipsis and its length (``"aaaa… (1,048,576 chars)"``).

    Every builder that puts a client's string (model, replica id, tenant, version …) into a
    message, ErrorInfo metadata or a field violation goes through this: statuses travel in
    HTTP/2 trailers, and a client with gRPC's C core refuses trailers past ~8 KB, so an
    echoed megabyte would cost the caller the typed error itself.
    """
    if len(value) <= limit:
        return value
    return f"{value[:limit]}… ({len(value):,} chars)"


def internal(message: str) -> RichError:
    """A bug on our side (an answer that could not be built or encoded): INTERNAL with
    reason ``INTERNAL``, instead of the bare INTERNAL or UNKNOWN gRPC would send."""
    return RichError(grpc.StatusCode.INTERNAL, message, reason=Reason.INTERNAL)


def invalid_argument(field: str, description: str) -> RichError:
    """A malformed request: INVALID_ARGUMENT with a BadRequest field violation.

    The description is cut at :data:`DESCRIPTION_CHARS` (:func:`echo`) in case it repeats
    more of the request than its builder meant to.
    """
    field, description = echo(field), echo(description, DESCRIPTION_CHARS)
    return RichError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invalid {field}: {description}",
        reason=Reason.INVALID_FIELD,
        metadata={"field": field},
        field_violations=[FieldViolation(field, description)],
    )


def undecodable(message_type: str) -> RichError:
    """Request bytes that do not parse as the method's message: INVALID_ARGUMENT naming
    ``request`` and the message type (one answer for every serving path)."""
    return invalid_argument("request", f"not a valid {message_type}")


def not_found_model(model: str) -> RichError:
    """A request for a model nobody serves: NOT_FOUND."""
    return RichError(
        grpc.StatusCode.NOT_FOUND,
        f"unknown model {echo(model)!r}",
        reason=Reason.UNKNOWN_MODEL,
        metadata={"model": echo(model)},
    )


def quota_exceeded(tenant: str, retry_after_s: float | None, description: str) -> RichError:
    """A tenant over its quota: RESOURCE_EXHAUSTED + QuotaFailure + RetryInfo.

    ``retry_after_s`` is the caller's computed refill time for the tokens the request needs;
    ``None`` or infinite (a bucket that never refills) sends no RetryInfo, since waiting
    cannot help.
    """
    retry = retry_after_s if retry_after_s is not None and math.isfinite(retry_after_s) else None
    return RichError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"tenant {echo(tenant)!r} is over quota: {description}",
        reason=Reason.QUOTA_EXCEEDED,
        metadata={"tenant": echo(tenant)},
        retry_after_s=retry,
        quota_violations=[QuotaViolation(f"tenant:{echo(tenant)}", description)],
    )


def unavailable(reason: Reason, message: str, retry_after_s: float | None) -> RichError:
    """Overload, full queue, no replica, draining…: UNAVAILABLE with the caller's retry advice."""
    return RichError(
        grpc.StatusCode.UNAVAILABLE, message, reason=reason, retry_after_s=retry_after_s
    )


def deadline_unreachable(
    message: str,
    predicted_completion_s: float | None = None,
    *,
    deadline_s: float | None = None,
    parts_s: Mapping[str, float] | None = None,
) -> RichError:
    """A request that provably cannot finish in time: DEADLINE_EXCEEDED, rejected up front.

    ``predicted_completion_s`` is the predicted time to completion in seconds from now; it
    travels as ErrorInfo metadata ``predicted_completion_ms`` (decimal, microsecond precision).
    ``deadline_s`` (time left to the deadline) travels as ``deadline_ms`` and each of
    ``parts_s`` (the prediction's parts, in seconds) as ``<name>_ms``, so a client can show
    what the prediction was made of without parsing the message.
    """
    metadata: dict[str, str] = {}
    if predicted_completion_s is not None:
        metadata[PREDICTED_COMPLETION_MS] = f"{predicted_completion_s * 1000.0:.3f}"
    if deadline_s is not None:
        metadata[DEADLINE_MS] = f"{deadline_s * 1000.0:.3f}"
    for name, seconds in (parts_s or {}).items():
        metadata[f"{name}_ms"] = f"{seconds * 1000.0:.3f}"
    return RichError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        message,
        reason=Reason.DEADLINE_UNREACHABLE,
        metadata=metadata,
    )


def deadline_missed(message: str) -> RichError:
    """Queued work evicted because it can no longer make its deadline: DEADLINE_EXCEEDED."""
    return RichError(grpc.StatusCode.DEADLINE_EXCEEDED, message, reason=Reason.DEADLINE_MISSED)


def unauthenticated(message: str, reason: Reason | None = None) -> RichError:
    """Missing or wrong credentials: UNAUTHENTICATED (optionally MISSING_/INVALID_CREDENTIALS)."""
    return RichError(grpc.StatusCode.UNAUTHENTICATED, message, reason=reason)


def permission_denied(message: str, reason: Reason | None = None) -> RichError:
    """Valid credentials, wrong role: PERMISSION_DENIED (optionally WRONG_ROLE)."""
    return RichError(grpc.StatusCode.PERMISSION_DENIED, message, reason=reason)


# -- the servicer boundary --------------------------------------------------------------------


def _merged_trailers(existing: Any, err: RichError) -> tuple[tuple[str, str | bytes], ...]:
    """Trailers already set on the context (minus ours) followed by the error's.

    ``context.abort`` *replaces* trailing metadata, so anything a servicer or interceptor
    set earlier would otherwise be lost.
    """
    ours = {DETAILS_KEY, PUSHBACK_KEY}
    kept = tuple((k, v) for k, v in (existing or ()) if k not in ours)
    return kept + err.trailing_metadata()


async def abort(context: grpc.aio.ServicerContext, err: RichError) -> NoReturn:
    """End the current aio RPC with ``err``: code, message, status details and pushback.

    ``grpc.aio`` contexts do have ``abort_with_status``, but it is only
    ``abort(status.code, status.details, status.trailing_metadata)``; calling ``abort``
    directly lets us keep trailers the servicer set before.
    """
    trailers = _merged_trailers(context.trailing_metadata(), err)
    await context.abort(err.code, err.message, trailers)
    raise AssertionError("grpc.aio ServicerContext.abort returned")  # pragma: no cover


def abort_sync(context: grpc.ServicerContext, err: RichError) -> NoReturn:
    """The same for a synchronous (thread-pool) server's context."""
    status = err.to_status()
    context.abort_with_status(
        status._replace(trailing_metadata=_merged_trailers(_sync_trailers(context), err))
    )
    raise AssertionError("grpc ServicerContext.abort_with_status returned")  # pragma: no cover


def _sync_trailers(context: grpc.ServicerContext) -> Any:
    # Sync contexts only expose trailing_metadata() on newer grpc versions.
    getter = getattr(context, "trailing_metadata", None)
    return getter() if callable(getter) else ()


# -- the client side --------------------------------------------------------------------------


def _call_attr(err: grpc.RpcError, name: str) -> Any:
    """``err.code()`` / ``.details()`` / ``.trailing_metadata()`` when present, else None.

    Both the sync ``_InactiveRpcError`` and ``grpc.aio.AioRpcError`` offer these as plain
    (non-async) methods; a bare ``grpc.RpcError`` offers none of them.
    """
    method = getattr(err, name, None)
    return method() if callable(method) else None


def _iter_trailers(trailers: Any) -> Iterable[tuple[str, Any]]:
    # A tuple of pairs (sync) or grpc.aio.Metadata (iterates as pairs) or None.
    if trailers is None:
        return ()
    return ((str(k), v) for k, v in trailers)


def parse_rpc_error(err: grpc.RpcError) -> RichError:
    """Rebuild the :class:`RichError` a server sent, from a sync or aio ``RpcError``.

    Tolerant: a missing or undecodable ``grpc-status-details-bin`` gives a RichError with
    just the code and message (plus the pushback trailer as ``retry_after_s`` if present).
    The code and message are the call's own; ``RetryInfo`` wins over the pushback trailer.
    """
    code = _call_attr(err, "code")
    if not isinstance(code, grpc.StatusCode) or code == grpc.StatusCode.OK:
        code = grpc.StatusCode.UNKNOWN
    details = _call_attr(err, "details")
    message = details if isinstance(details, str) else str(err)

    status: status_pb2.Status | None = None
    pushback_ms: int | None = None
    for key, value in _iter_trailers(_call_attr(err, "trailing_metadata")):
        if key == DETAILS_KEY and status is None:
            try:
                status = status_pb2.Status.FromString(
                    value if isinstance(value, bytes) else str(value).encode()
                )
            except DecodeError:
                status = None
        elif key == PUSHBACK_KEY:
            try:
                pushback_ms = int(value.decode() if isinstance(value, bytes) else value)
            except ValueError:
                pushback_ms = None

    result = RichError(code, message)
    if pushback_ms is not None and pushback_ms >= 0:
        result.retry_after_s = pushback_ms / 1000.0
    if status is not None:
        _apply_details(result, status)
    return result


def _apply_details(result: RichError, status: status_pb2.Status) -> None:
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            result.reason = _as_reason(info.reason)
            result.domain = info.domain
            result.metadata = dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            result.retry_after_s = to_seconds(retry.retry_delay)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            result.field_violations = [
                FieldViolation(v.field, v.description) for v in bad.field_violations
            ]
        elif detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            quota = error_details_pb2.QuotaFailure()
            detail.Unpack(quota)
            result.quota_violations = [
                QuotaViolation(v.subject, v.description) for v in quota.violations
            ]


def _as_reason(reason: str) -> str:
    """A known reason as the :class:`Reason` member (equal to the string either way)."""
    try:
        return Reason(reason)
    except ValueError:
        return reason
