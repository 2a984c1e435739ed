"""The Infer path: authenticate, validate, pick the version, admit, queue, and settle the answer.

What it decides: the order of the four decisions for every request — admission (tenant quota,
then the adaptive limit with priority shedding), version (sticky hash over the controller's
weights), batching and routing (the request's (model, version) dispatcher) — and how each
outcome is charged back: the limiter learns only from successes, quota is refunded for shed
work, and every request's outcome is reported to the controller as canary evidence. Every exit
of ``admit`` raises its rejection and every answer is settled into one
:class:`gateway.request_end.RequestEnd`; one method, :meth:`InferPath._record_end`, records
it (metrics, admission feedback, evidence), so each way a call ends is counted once. Why here:
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
    internal,
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
from gateway.admission.quota_shares import QuotaShares
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
from gateway.request_end import Ending, RequestEnd
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
# Refusals before admission that the controller hears of, as sheds: the gateway had no capacity
# for the request (no replica, no fleet yet, or its adaptive limit), evidence about the fleet.
_CAPACITY_REFUSALS = frozenset({Reason.NO_CAPACITY, Reason.OVERLOADED})
_SHED_LABELS = frozenset(SHED_REASONS)
_OK = control_pb2.REQUEST_OUTCOME_KIND_OK
_ERROR = control_pb2.REQUEST_OUTCOME_KIND_ERROR
_SHED = control_pb2.REQUEST_OUTCOME_KIND_SHED
_LATE = control_pb2.REQUEST_OUTCOME_KIND_LATE


def internal_error(what: str, exc: BaseException) -> RichError:
    """A bug, not a verdict: INTERNAL with a reason instead of UNKNOWN."""
    log.error(what, exc_info=exc)
    return internal(f"internal error in the gateway ({type(exc).__name__})")


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
    quota_shares: QuotaShares
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

        Raises the typed rejection (already recorded) when the request goes no further: each
        exit below raises its rejection, and the one handler at the end records how the call
        ended, once. Else the request is answered by its dispatcher, or by the answer guard if
        a bug or a lost worker reply leaves it unanswered past its deadline.
        """
        # What is known so far, for the handler that records an exit.
        tenant: TenantConfig | None = None
        valid: ValidRequest | None = None
        series: RequestSeries | None = None
        version = ""
        ticket: AdmissionTicket | None = None
        now = 0.0
        try:
            if self._closing:
                raise unavailable(Reason.SHUTTING_DOWN, "the gateway is shutting down", None)
            tenant = self._authenticate(metadata)
            valid = validate(request, time_remaining_s, self.config.default_timeout_s)
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
                    raise unavailable(Reason.NO_CAPACITY, why, self._fleet_retry_hint())
                raise not_found_model(valid.model)
            version = split.version_for(valid.session_key or request_id)
            series = self.metrics.series(tenant.name, valid.model, version)
            dispatcher = self.dispatchers.get((valid.model, version))
            if dispatcher is None or not dispatcher.has_replicas:
                raise unavailable(
                    Reason.NO_CAPACITY,
                    f"no replica serves {valid.model} {version} right now",
                    self._fleet_retry_hint(),
                )
            cost = request_cost(valid.input_tokens, valid.max_output_tokens)
            # Demand for the fleet-wide quota: every arrival that reaches admission, admitted
            # or refused (refusals are the demand a share did not cover).
            self.quota_shares.demand.observe(tenant.name, cost, now)
            granted = self.admission.admit(tenant, cost, now, _PRIORITY.get(valid.priority))
            if isinstance(granted, QuotaExceeded):
                raise quota_exceeded(granted.tenant, granted.retry_after_s, granted.description)
            if isinstance(granted, Overloaded):
                raise unavailable(
                    Reason.OVERLOADED,
                    f"the gateway is at its adaptive concurrency limit for {granted.priority} "
                    f"traffic ({granted.allowed} of {granted.limit})",
                    granted.retry_after_s,
                )
            ticket = granted
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
            pending = PendingRequest(
                request_id=request_id,
                valid=valid,
                received_at=now,
                deadline=now + valid.timeout_s,
                span_context=span_context,
            )
            if self._guard is None:
                self._guard = AnswerGuard(asyncio.get_running_loop(), _expire)
            self._guard.watch(pending, valid.timeout_s + ANSWER_GRACE_S)
        except Exception as exc:  # every exit: the rejection, or a bug (never UNKNOWN)
            err = (
                exc
                if isinstance(exc, RichError)
                else internal_error("Infer failed before admission", exc)
            )
            self._record_end(
                self._early_end(err, request.model, tenant, valid, series, version, ticket, now)
            )
            if err is exc:
                raise
            raise err from exc
        self._inflight += 1
        try:
            dispatcher.submit(pending)
        except RichError as err:  # refused by the batcher: settled like any other answer
            pending.reject(err)
        except Exception as exc:
            pending.reject(internal_error("Infer failed unexpectedly", exc))
        return Admitted(pending, ticket, version, series)

    def _early_end(
        self,
        err: RichError,
        model: str,
        tenant: TenantConfig | None,
        valid: ValidRequest | None,
        series: RequestSeries | None,
        version: str,
        ticket: AdmissionTicket | None,
        admitted_at: float,
    ) -> RequestEnd:
        """How a call that ``admit`` answered with ``err`` ended, from what it knew by then."""
        if series is None:  # refused before a version was chosen: client input is no label
            label = model if model in self.fleet.models() else UNKNOWN_MODEL
            series = self.metrics.series(
                NO_TENANT if tenant is None else tenant.name, label, NO_VERSION
            )
        if ticket is None:
            priority = None
            if tenant is not None and valid is not None:
                priority = _effective_priority(tenant, valid)
            return RequestEnd(Ending.REFUSED, series, model, version, err, priority)
        # Admitted, then a bug before it was queued: its ticket is released like a failure's.
        done = self.clock.now()
        return RequestEnd(
            Ending.FAILED,
            series,
            model,
            version,
            err,
            ticket.priority,
            ticket,
            done,
            done - admitted_at,
        )

    def settle(self, admitted: Admitted) -> infer_pb2.InferResponse | RichError:
        """Account for an answered request; its response, or the typed error to send."""
        pending = admitted.pending
        self._inflight -= 1
        exc = pending.error
        if exc is None:
            result = pending.result
            assert result is not None  # answered without an error
            done = self.clock.now()
            total = done - pending.received_at
            self._record_end(
                RequestEnd(
                    Ending.ANSWERED,
                    admitted.series,
                    pending.valid.model,
                    admitted.version,
                    None,
                    admitted.ticket.priority,
                    admitted.ticket,
                    done,
                    total,
                    done <= pending.deadline,
                    result.replica_id,
                )
            )
            return _response(pending, admitted.version, result, total)
        err = exc if isinstance(exc, RichError) else internal_error("Infer failed", exc)
        done = self.clock.now()
        self._record_end(
            RequestEnd(
                Ending.FAILED,
                admitted.series,
                pending.valid.model,
                admitted.version,
                err,
                admitted.ticket.priority,
                admitted.ticket,
                done,
                done - pending.received_at,
                budget_s=pending.deadline - pending.received_at,
            )
        )
        return err

    def settle_cancelled(self, admitted: Admitted) -> None:
        """The client went away (or its gRPC deadline passed): free everything, no sample."""
        self._inflight -= 1
        self._record_end(
            RequestEnd(
                Ending.CANCELLED,
                admitted.series,
                admitted.pending.valid.model,
                admitted.version,
                ticket=admitted.ticket,
                at=self.clock.now(),
            )
        )

    def _record_end(self, end: RequestEnd) -> None:
        """Record how a request ended, for every end alike (the one place that does).

        The outcome counter of its series (with latency and goodput for an answer); a shed
        also by reason and priority; an admitted request's ticket finished, so the limiter
        learns only from successes and shed work is refunded its quota; and the controller's
        evidence: every admitted request's outcome, and the refusals for lack of capacity.
        """
        series = end.series
        ending = end.ending
        ticket = end.ticket
        link = self.link
        if ending is Ending.ANSWERED:
            assert ticket is not None
            series.answered(end.latency_s, end.on_time)
            self.admission.finish(ticket, AdmissionOutcome.SUCCESS, end.latency_s, end.at)
            if link is not None:
                kind = _OK if end.on_time else _LATE
                link.record_request(end.model, end.version, end.replica, kind, end.latency_s)
            return
        if ending is Ending.CANCELLED:
            assert ticket is not None
            series.outcomes["cancelled"].inc()
            self.admission.finish(ticket, AdmissionOutcome.CANCELLED, None, end.at)
            return
        err = end.error
        assert err is not None  # REFUSED and FAILED carry their error
        label = _outcome_label(err)
        series.outcomes[label].inc()
        if end.priority is not None and label in _SHED_LABELS:
            self.metrics.count_shed(label, end.priority.value)
        if ending is Ending.FAILED:
            assert ticket is not None
            shed = err.reason in _SHED_REASONS
            self.admission.finish(
                ticket,
                AdmissionOutcome.SHED if shed else AdmissionOutcome.FAILED,
                None,
                end.at,
                queue_shed_budget_s=_queue_shed_budget(err, end.budget_s),
            )
            if link is not None:
                kind = _SHED if shed else _ERROR
                link.record_request(end.model, end.version, "", kind, end.latency_s)
        elif err.reason in _CAPACITY_REFUSALS and link is not None:
            # The adaptive limit is the gateway's own, shared by every version: evidence about
            # the gateway, not about this request's version, so it is reported without one.
            version = "" if err.reason == Reason.OVERLOADED else end.version
            link.record_request(end.model, version, "", _SHED, 0.0)

    def _fleet_retry_hint(self) -> float | None:
        """When the fleet view can next change: None without a controller (it never will)."""
        return None if self.link is None else self.link.retry_hint()


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
