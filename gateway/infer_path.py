"""The Infer path: authenticate, validate, pick the version, admit, queue, and settle the answer.

What it decides: the order of the four decisions for every request — admission (tenant quota,
then the adaptive limit with priority shedding), version (sticky hash over the controller's
weights), batching and routing (the request's (model, version) dispatcher) — and how each
outcome is charged back: the limiter learns only from successes, quota is refunded for shed
work, and every request's outcome is reported to the controller as canary evidence. Why here:
both transport adapters in :mod:`gateway.app` share every one of these decisions and answers,
so they live once, as :class:`InferPath`, a part of :class:`gateway.app.GatewayApp`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from common.auth import AuthPolicy
from common.clock import Clock
from common.durations import set_duration
from common.errors import (
    Reason,
    RichError,
    not_found_model,
    permission_denied,
    quota_exceeded,
    unauthenticated,
    unavailable,
)
from gateway.admission import (
    AdmissionController,
    AdmissionOutcome,
    AdmissionTicket,
    Priority,
    TenantConfig,
    TenantRegistry,
    request_cost,
)
from gateway.admission.quota import QuotaExceeded
from gateway.admission.shedder import Overloaded
from gateway.answer_guard import AnswerGuard
from gateway.config import GatewayConfig
from gateway.controller_link import ControllerLink
from gateway.dispatcher import (
    InferResult,
    PendingRequest,
    VersionDispatcher,
)
from gateway.fleet_state import FleetState
from gateway.metrics import (
    NO_TENANT,
    NO_VERSION,
    REQUEST_OUTCOMES,
    SHED_REASONS,
    UNKNOWN_MODEL,
    GatewayMetrics,
    RequestSeries,
)
from gateway.validation import ValidRequest, validate
from halcyon.v1 import control_pb2, infer_pb2

log = logging.getLogger("halcyon.gateway")

SERVICE_NAME = "halcyon.v1.InferService"
INFER_METHOD = f"/{SERVICE_NAME}/Infer"
# How long past its deadline the gateway waits for an answer before giving up on it itself.
# The batcher answers before the deadline; this only bounds a bug or a lost worker reply.
ANSWER_GRACE_S = 0.25

_PRIORITY: dict[int, Priority] = {
    infer_pb2.PRIORITY_CRITICAL: Priority.CRITICAL,
    infer_pb2.PRIORITY_STANDARD: Priority.STANDARD,
    infer_pb2.PRIORITY_SHEDDABLE: Priority.SHEDDABLE,
}
# Rejections that mean no work was done for the request: its quota is refunded.
# Batcher refusals of admitted work that say the queue ahead was too long (limiter evidence).
_QUEUE_SHED_REASONS = frozenset(
    {Reason.DEADLINE_UNREACHABLE, Reason.DEADLINE_MISSED, Reason.QUEUE_FULL}
)


def _queue_shed_budget(err: RichError, budget_s: float) -> float | None:
    """``budget_s`` if ``err`` blames the queue ahead, None if not (or if the request's own work
    took half its budget: then the request, not the queue, was too much for its deadline)."""
    if err.reason not in _QUEUE_SHED_REASONS:
        return None
    meta = err.metadata
    try:
        own = float(meta.get("own_ms", 0.0)) + float(meta.get("margin_ms", 0.0))
        deadline = float(meta.get("deadline_ms", "inf"))
    except ValueError:
        return None
    if own >= 0.5 * deadline:
        return None
    return budget_s


_SHED_REASONS = frozenset(
    {
        Reason.DEADLINE_UNREACHABLE,
        Reason.DEADLINE_MISSED,
        Reason.QUEUE_FULL,
        Reason.NO_CAPACITY,
        Reason.OVERLOADED,
        Reason.SHUTTING_DOWN,
    }
)
_OK = control_pb2.REQUEST_OUTCOME_KIND_OK
_ERROR = control_pb2.REQUEST_OUTCOME_KIND_ERROR
_SHED = control_pb2.REQUEST_OUTCOME_KIND_SHED
_LATE = control_pb2.REQUEST_OUTCOME_KIND_LATE


def internal_error(what: str, exc: BaseException) -> RichError:
    """A bug, not a verdict: INTERNAL with a reason instead of UNKNOWN."""
    log.error(what, exc_info=exc)
    return RichError(
        grpc.StatusCode.INTERNAL,
        f"internal error in the gateway ({type(exc).__name__})",
        reason=Reason.INTERNAL,
    )


@dataclass(slots=True, eq=False)
class Admitted:
    """A request past admission and queued in a dispatcher: what settling its answer needs."""

    pending: PendingRequest
    ticket: AdmissionTicket
    version: str
    series: RequestSeries


class InferPath:
    """The Infer decisions of :class:`gateway.app.GatewayApp` (which sets every attribute)."""

    config: GatewayConfig
    clock: Clock
    auth: AuthPolicy
    metrics: GatewayMetrics
    tenants: TenantRegistry
    admission: AdmissionController
    fleet: FleetState
    dispatchers: dict[tuple[str, str], VersionDispatcher]
    link: ControllerLink | None
    _ids: itertools.count[int]
    _id_prefix: str
    _closing: bool
    _inflight: int
    _guard: AnswerGuard[PendingRequest] | None

    def _authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> TenantConfig:
        key: str | None = None
        for item in metadata or ():
            name = item[0]
            if name == "x-api-key":
                key = str(item[1])
                break
            if name == "authorization":
                value = str(item[1])
                if value[:7].lower() == "bearer ":
                    key = value[7:].strip()
                    break
        if not key:
            raise unauthenticated(
                "missing API key: send it as 'x-api-key' or 'authorization: Bearer <key>'",
                Reason.MISSING_CREDENTIALS,
            )
        tenant = self.tenants.authenticate(key)
        if tenant is None:
            roles = self.auth.roles_of(key)
            if roles:
                err = permission_denied(
                    f"Infer needs a tenant API key; this is the {'/'.join(sorted(roles))} "
                    "credential",
                    Reason.WRONG_ROLE,
                )
                err.metadata = {"method": INFER_METHOD, "required_role": "tenant"}
                raise err
            raise unauthenticated("unknown API key", Reason.INVALID_CREDENTIALS)
        return tenant

    def admit(
        self,
        request: infer_pb2.InferRequest,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        time_remaining_s: float | None,
        span: trace.Span = trace.INVALID_SPAN,
    ) -> Admitted:
        """Authenticate, validate, pick the version, admit, and queue the request.

        ``span`` is the call's RPC span (the adapter's to end): batches link to it.

        Raises the typed rejection (already counted) when the request goes no further; else
        the request is answered by its dispatcher, or by the answer guard if a bug or a lost
        worker reply leaves it unanswered past its deadline.
        """
        metrics = self.metrics
        tenant_name = NO_TENANT
        try:
            if self._closing:
                raise unavailable(Reason.SHUTTING_DOWN, "the gateway is shutting down", None)
            tenant = self._authenticate(metadata)
            tenant_name = tenant.name
            valid = validate(request, time_remaining_s, self.config.default_timeout_s)
        except RichError as err:
            model = request.model if request.model in self.fleet.models() else UNKNOWN_MODEL
            self._count_refused(err, metrics.series(tenant_name, model, NO_VERSION), None)
            raise
        now = self.clock.now()
        request_id = f"{self._id_prefix}-{next(self._ids):x}"
        split = self.fleet.splits.get(valid.model)
        if split is None:
            if self.fleet.generation == 0 or valid.model in self.fleet.models():
                # No fleet snapshot yet, or the controller has no stable version for the
                # model: a retry can work once the controller says more.
                why = (
                    "the gateway has not received the fleet from the controller yet"
                    if self.fleet.generation == 0
                    else f"model {valid.model!r} has no stable version configured"
                )
                pending_fleet = unavailable(Reason.NO_CAPACITY, why, self._fleet_retry_hint())
                model = valid.model if self.fleet.generation else UNKNOWN_MODEL
                series = metrics.series(tenant.name, model, NO_VERSION)
                self._finish_unadmitted(valid.model, "", pending_fleet, series, tenant, valid)
                raise pending_fleet
            missing = not_found_model(valid.model)
            self._count_refused(missing, metrics.series(tenant.name, UNKNOWN_MODEL, NO_VERSION))
            raise missing
        version = split.version_for(valid.session_key or request_id)
        series = metrics.series(tenant.name, valid.model, version)
        dispatcher = self.dispatchers.get((valid.model, version))
        if dispatcher is None or not dispatcher.has_replicas:
            no_replica = unavailable(
                Reason.NO_CAPACITY,
                f"no replica serves {valid.model} {version} right now",
                self._fleet_retry_hint(),
            )
            self._finish_unadmitted(valid.model, version, no_replica, series, tenant, valid)
            raise no_replica
        ticket = self.admission.admit(
            tenant,
            request_cost(valid.input_tokens, valid.max_output_tokens),
            now,
            _PRIORITY.get(valid.priority),
        )
        if isinstance(ticket, QuotaExceeded):
            over_quota = quota_exceeded(ticket.tenant, ticket.retry_after_s, ticket.description)
            self._count_refused(over_quota, series, _effective_priority(tenant, valid))
            raise over_quota
        if isinstance(ticket, Overloaded):
            overloaded = unavailable(
                Reason.OVERLOADED,
                f"the gateway is at its adaptive concurrency limit for {ticket.priority} "
                f"traffic ({ticket.allowed} of {ticket.limit})",
                ticket.retry_after_s,
            )
            # The gateway's own limit, shared by every version: evidence about the gateway, not
            # about this request's version, so it is not reported as one (as with quota).
            self._finish_unadmitted(valid.model, "", overloaded, series, tenant, valid)
            raise overloaded

        span_context: trace.SpanContext | None = None
        if span.is_recording():
            span.set_attributes(
                {
                    "halcyon.tenant": tenant.name,
                    "halcyon.model": valid.model,
                    "halcyon.version": version,
                }
            )
            span_context = span.get_span_context()
        loop = asyncio.get_running_loop()
        pending = PendingRequest(
            request_id=request_id,
            valid=valid,
            received_at=now,
            deadline=now + valid.timeout_s,
            span_context=span_context,
        )
        if self._guard is None:
            self._guard = AnswerGuard(loop, _expire)
        self._guard.watch(pending, valid.timeout_s + ANSWER_GRACE_S)
        self._inflight += 1
        try:
            dispatcher.submit(pending)
        except RichError as err:  # refused by the batcher: settled like any other answer
            pending.reject(err)
        except Exception as exc:
            pending.reject(internal_error("Infer failed unexpectedly", exc))
        return Admitted(pending, ticket, version, series)

    def settle(self, admitted: Admitted) -> infer_pb2.InferResponse | RichError:
        """Account for an answered request; its response, or the typed error to send."""
        pending = admitted.pending
        self._inflight -= 1
        valid = pending.valid
        now = pending.received_at
        exc = pending.error
        if exc is not None:
            err = exc if isinstance(exc, RichError) else internal_error("Infer failed", exc)
            outcome = (
                AdmissionOutcome.SHED if err.reason in _SHED_REASONS else AdmissionOutcome.FAILED
            )
            done = self.clock.now()
            self.admission.finish(
                admitted.ticket,
                outcome,
                None,
                done,
                queue_shed_budget_s=_queue_shed_budget(err, pending.deadline - now),
            )
            kind = _SHED if outcome is AdmissionOutcome.SHED else _ERROR
            self._report(valid.model, admitted.version, "", kind, done - now)
            self._count_refused(err, admitted.series, admitted.ticket.priority)
            return err
        result = pending.result
        assert result is not None  # answered without an error
        done = self.clock.now()
        total = done - now
        self.admission.finish(admitted.ticket, AdmissionOutcome.SUCCESS, total, done)
        late = done > pending.deadline
        self._report(
            valid.model, admitted.version, result.replica_id, _LATE if late else _OK, total
        )
        admitted.series.answered(total, not late)
        return _response(pending, admitted.version, result, total)

    def settle_cancelled(self, admitted: Admitted) -> None:
        """The client went away (or its gRPC deadline passed): free everything, no sample."""
        self._inflight -= 1
        self.admission.finish(admitted.ticket, AdmissionOutcome.CANCELLED, None, self.clock.now())
        admitted.series.outcomes["cancelled"].inc()

    def _fleet_retry_hint(self) -> float | None:
        """When the fleet view can next change: None without a controller (it never will)."""
        return None if self.link is None else self.link.retry_hint()

    def _finish_unadmitted(
        self,
        model: str,
        version: str,
        err: RichError,
        series: RequestSeries,
        tenant: TenantConfig,
        valid: ValidRequest,
    ) -> None:
        self._count_refused(err, series, _effective_priority(tenant, valid))
        self._report(model, version, "", _SHED, 0.0)

    def _count_refused(
        self, err: RichError, series: RequestSeries, priority: Priority | None = None
    ) -> None:
        """Count a request that ended with ``err``; a shed also by reason and priority."""
        label = _outcome_label(err)
        series.outcomes[label].inc()
        if priority is not None and label in SHED_REASONS:
            self.metrics.count_shed(label, priority.value)

    def _report(self, model: str, version: str, replica: str, kind: int, latency: float) -> None:
        if self.link is not None:
            self.link.record_request(model, version, replica, kind, latency)


def _expire(pending: PendingRequest) -> None:
    pending.reject(
        RichError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "no answer before the deadline",
            reason=Reason.DEADLINE_MISSED,
        )
    )


def _effective_priority(tenant: TenantConfig, valid: ValidRequest) -> Priority:
    """The priority admission applies: the request's, capped at its tenant's."""
    requested = _PRIORITY.get(valid.priority)
    return tenant.priority if requested is None else requested.capped_by(tenant.priority)


def _outcome_label(err: RichError) -> str:
    if err.reason == "OVERLOADED" and err.metadata.get("shed") == "goodput":
        return "shed_for_goodput"
    if err.reason:
        label = str(err.reason).lower()
        if label in REQUEST_OUTCOMES:
            return label
        if label in ("missing_credentials", "invalid_credentials", "wrong_role"):
            return "unauthenticated"
        if label == "invalid_field":
            return "invalid_argument"
    if err.code == grpc.StatusCode.INVALID_ARGUMENT:
        return "invalid_argument"
    if err.code == grpc.StatusCode.UNAUTHENTICATED:
        return "unauthenticated"
    return "upstream_failure"


def _response(
    pending: PendingRequest, version: str, result: InferResult, total: float
) -> infer_pb2.InferResponse:
    v = pending.valid
    response = infer_pb2.InferResponse(
        output=result.output,
        model=v.model,
        version=version,
        replica_id=result.replica_id,
        hedged=result.hedged,
        request_id=pending.request_id,
    )
    # Sub-messages filled in place: about a third of the cost of building them and copying
    # them in (this runs once per request).
    timings = response.timings
    set_duration(timings.queued, result.dispatched_at - pending.received_at)
    set_duration(timings.execution, result.execution_s)
    set_duration(timings.total, total)
    batch = response.batch
    batch.size = result.batch_size
    batch.flush_reason = result.flush_reason  # type: ignore[assignment]
    batch.tokens = result.batch_tokens
    usage = response.usage
    usage.input_tokens = v.input_tokens
    usage.output_tokens = result.output_tokens
    usage.total_tokens = v.input_tokens + result.output_tokens
    return response
