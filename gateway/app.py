"""The gateway process: the Infer path wired from the four policies, plus its soft state.

What it decides: the order of the four decisions for every request — admission (tenant quota,
then the adaptive limit with priority shedding), version (sticky hash over the controller's
weights), batching and routing (one :class:`~gateway.dispatcher.VersionDispatcher` per
(model, version)) — and how each outcome is charged back: the limiter learns only from
successes, quota is refunded for shed work, and every request's outcome is reported to the
controller as canary evidence. The fleet view is soft state pushed by the controller; when the
controller is away the gateway keeps serving on the last snapshot.

Shutdown (SIGTERM): readiness off, new requests refused with ``UNAVAILABLE / SHUTTING_DOWN``,
queued and in-flight work finishes within the grace period, and anything still queued after it
gets a typed answer. No accepted request goes unanswered.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError
from opentelemetry import trace
from prometheus_client import Gauge

from common.auth import AuthPolicy, bearer_metadata
from common.backoff import controller_channel_options
from common.clock import Clock, MonotonicClock
from common.durations import set_duration, to_duration
from common.errors import (
    Reason,
    RichError,
    abort,
    not_found_model,
    permission_denied,
    quota_exceeded,
    unauthenticated,
    unavailable,
    undecodable,
)
from common.grpc_metrics import ClientMetricsInterceptors, GrpcClientMetrics, UnaryClientRecorder
from common.raw_unary import RawCall, RawUnaryEndpoint
from common.rng import SeededRng
from common.serving import ServiceHost, ServingOptions, TlsOptions
from common.tracing import client_interceptors, end_rpc_span, spans_recorded, start_server_span
from gateway.admission import (
    AdmissionController,
    AdmissionOutcome,
    AdmissionTicket,
    GradientLimiter,
    GradientLimiterConfig,
    Priority,
    PriorityShedder,
    TenantConfig,
    TenantQuotas,
    TenantRegistry,
    request_cost,
)
from gateway.admission.quota import QuotaExceeded
from gateway.admission.shedder import Overloaded
from gateway.answer_guard import AnswerGuard
from gateway.batching import Batch, BatcherConfig, FlushReason, Objective
from gateway.batching.fixed import BatchingStrategy, make_batcher
from gateway.controller_link import ControllerLink, GatewayHealth
from gateway.dispatcher import (
    EXECUTE_BATCH_METHOD,
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
    GatewaySnapshot,
    LoopSnapshot,
    ReplicaSample,
    RequestSeries,
    TenantTotals,
)
from gateway.routing import BreakerState, HedgePolicy, PeakEwmaRouter
from gateway.validation import ValidRequest, validate
from gateway.versioning import BUCKETS
from gateway.worker_pool import WorkerPool
from halcyon.v1 import control_pb2, fleet_pb2, infer_pb2, infer_pb2_grpc

log = logging.getLogger("halcyon.gateway")

SERVICE_NAME = "halcyon.v1.InferService"
INFER_METHOD = f"/{SERVICE_NAME}/Infer"
# How long past its deadline the gateway waits for an answer before giving up on it itself.
# The batcher answers before the deadline; this only bounds a bug or a lost worker reply.
ANSWER_GRACE_S = 0.25
# Twice the largest valid InferRequest (64 KiB of input plus small fields): anything bigger is
# refused unparsed with RESOURCE_EXHAUSTED / MESSAGE_TOO_LARGE.
MAX_INFER_REQUEST_BYTES = 128 * 1024

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


@dataclass
class GatewayConfig:
    """Everything a gateway process is told at start."""

    serving: ServingOptions
    tenants: TenantRegistry
    controller: str | None = None
    fleet_token: str = ""
    # Known only so that an operator token sent to Infer is refused as WRONG_ROLE.
    operator_token: str = ""
    gateway_id: str = field(default_factory=lambda: f"gw-{socket.gethostname()}-{os.getpid()}")
    default_timeout_s: float = 10.0
    seed: int = 0
    objective: Objective = Objective.ON_TIME_REQUESTS
    report_interval_s: float = 1.0
    # How long an idle replica may be held back to let a batch grow. Zero: an idle replica
    # takes work at once (continuous batching) — batches grow by themselves while replicas are
    # busy, and waiting on an idle one only adds latency at light load.
    linger_s: float = 0.0
    # Which batcher serves (``--batching``): Halcyon's, or one of the seed's baselines (fixed
    # 32 items / 25 ms linger, or one request per batch) for a like-for-like comparison.
    batching: BatchingStrategy = BatchingStrategy.HALCYON
    controller_tls: TlsOptions | None = None
    worker_tls: TlsOptions | None = None
    # Batching raises latency with concurrency by design (bigger batches), so the limiter
    # tolerates a doubling before it reads a queue (Gradient2's default) plus 25 ms (on a fast
    # fleet a doubling is a few milliseconds, no overload next to deadlines in seconds), and
    # never cuts below what one batch per replica slot needs; the batcher sheds infeasible
    # work itself.
    limiter: GradientLimiterConfig = field(
        default_factory=lambda: GradientLimiterConfig(
            initial_limit=128.0, min_limit=32.0, tolerance=2.0, queue_slack_s=0.025
        )
    )


class InferServicer(infer_pb2_grpc.InferServiceServicer):
    """Thin aio adapter: protobuf in, :class:`GatewayApp` decisions, protobuf or a rich status out.

    Serves Infer only where the completion-queue endpoint (:class:`RawInferAdapter`) could not
    attach; both adapters share every decision and every answer.
    """

    def __init__(self, app: GatewayApp) -> None:
        self._app = app

    async def Infer(
        self, request: infer_pb2.InferRequest, context: grpc.aio.ServicerContext
    ) -> infer_pb2.InferResponse:
        app = self._app
        # The OpenTelemetry interceptor's span for this call (it ends it, with the status).
        span = trace.get_current_span()
        try:
            admitted = app.admit(
                request, context.invocation_metadata(), context.time_remaining(), span
            )
        except RichError as err:
            await abort(context, err)
        except Exception as exc:  # never UNKNOWN: a bug still gets a typed answer
            await abort(context, internal_error("Infer failed before admission", exc))
        pending = admitted.pending
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake(_: PendingRequest) -> None:
            if not answered.done():
                answered.set_result(None)

        pending.when_answered(wake)
        try:
            await answered
        except asyncio.CancelledError:
            # The client went away (or its gRPC deadline passed): free everything, no sample.
            pending.cancel()
            app.settle_cancelled(admitted)
            raise
        answer = app.settle(admitted)
        if isinstance(answer, RichError):
            await abort(context, answer)
        return answer


class RawInferAdapter:
    """Thin completion-queue adapter: the same decisions as :class:`InferServicer`, without
    grpc.aio's per-call tasks (``common.raw_unary``; ADR 0006)."""

    def __init__(self, app: GatewayApp) -> None:
        self._app = app
        self._parse = infer_pb2.InferRequest.FromString
        self._tracer = trace.get_tracer("halcyon.gateway")

    def __call__(self, call: RawCall) -> None:
        app = self._app
        # The span the OpenTelemetry interceptor makes on the grpc.aio path; none at all when
        # nothing would record it (common.tracing.spans_recorded).
        span = (
            start_server_span(self._tracer, INFER_METHOD, call.metadata, call.peer())
            if spans_recorded()
            else trace.INVALID_SPAN
        )
        try:
            request = self._parse(call.request)
            admitted = app.admit(request, call.metadata, call.time_remaining(), span)
        except DecodeError:
            _reject(call, span, undecodable("halcyon.v1.InferRequest"))
            return
        except RichError as err:
            _reject(call, span, err)
            return
        except Exception as exc:  # never UNKNOWN: a bug still gets a typed answer
            _reject(call, span, internal_error("Infer failed before admission", exc))
            return
        pending = admitted.pending
        # A cancelled request is skipped by its batch and settled below.
        call.on_cancel = pending.cancel

        def answer(_: PendingRequest) -> None:
            if pending.cancelled:
                app.settle_cancelled(admitted)
                if span is not trace.INVALID_SPAN:
                    end_rpc_span(span, grpc.StatusCode.CANCELLED)
                return
            outcome = app.settle(admitted)
            if isinstance(outcome, RichError):
                _reject(call, span, outcome)
                return
            call.reply(outcome.SerializeToString())
            if span is not trace.INVALID_SPAN:
                end_rpc_span(span, grpc.StatusCode.OK)

        pending.when_answered(answer)


def _reject(call: RawCall, span: trace.Span, err: RichError) -> None:
    call.reject(err)
    if span is not trace.INVALID_SPAN:
        end_rpc_span(span, err.code, err.message)


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


class GatewayApp:
    """One gateway: host, fleet view, dispatchers, admission, controller link."""

    def __init__(self, config: GatewayConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or MonotonicClock()
        # Fail-closed method table; Infer is TENANT access, checked by _authenticate.
        self.auth = AuthPolicy(
            fleet_token=config.fleet_token or None, operator_token=config.operator_token or None
        )
        self.host = ServiceHost("gateway", config.serving, self.auth)
        self.metrics = GatewayMetrics(self.host.registry, self.host.scrape_hooks)
        self._snapshot = LoopSnapshot(self._take_snapshot, GatewaySnapshot())
        self.metrics.watch(self._snapshot)
        Gauge(
            "halcyon_gateway_batching_info",
            "1 for the batcher this gateway serves with (--batching): halcyon, fixed or none",
            ["strategy"],
            registry=self.host.registry,
        ).labels(config.batching.value).set(1)
        self.tenants = config.tenants
        self.admission = AdmissionController(
            TenantQuotas(config.tenants),
            GradientLimiter(config.limiter, now=self.clock.now()),
            PriorityShedder(),
        )
        self.fleet = FleetState()
        self.dispatchers: dict[tuple[str, str], VersionDispatcher] = {}
        # grpc_client_* metrics for the gateway's calls to the controller (interceptors) and
        # to workers (recorded by the dispatchers: ExecuteBatch is on the hot path).
        client_metrics = GrpcClientMetrics(self.host.registry)
        self._client_interceptors = [
            *client_interceptors(),
            *ClientMetricsInterceptors(client_metrics).all(),
        ]
        self._execute_metrics = UnaryClientRecorder(client_metrics, EXECUTE_BATCH_METHOD)
        self.pool = WorkerPool(
            config.worker_tls.channel_credentials() if config.worker_tls else None
        )
        self.link: ControllerLink | None = None
        self._controller_channel: grpc.aio.Channel | None = None
        self._fleet_md = bearer_metadata(config.fleet_token) if config.fleet_token else ()
        self._ids = itertools.count(1)
        self._id_prefix = config.gateway_id
        self._seeds = itertools.count(config.seed)
        self._closing = False
        self._inflight = 0
        self._guard: AnswerGuard[PendingRequest] | None = None
        # Infer is served off its own completion queue (ADR 0006); the aio servicer serves it
        # only if that endpoint cannot attach (see ServiceHost.add_service).
        self.host.add_service(
            infer_pb2_grpc.add_InferServiceServicer_to_server, InferServicer(self), SERVICE_NAME
        )
        infer_endpoint = RawUnaryEndpoint(
            INFER_METHOD, RawInferAdapter(self), self.host.grpc_metrics
        )
        infer_endpoint.max_request_bytes = MAX_INFER_REQUEST_BYTES
        self.host.add_raw_unary(infer_endpoint)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._snapshot.bind(asyncio.get_running_loop())
        await self.host.start()
        cfg = self.config
        if cfg.controller:
            if cfg.controller_tls is not None:
                channel = grpc.aio.secure_channel(
                    cfg.controller,
                    cfg.controller_tls.channel_credentials(),
                    options=controller_channel_options(),
                    interceptors=self._client_interceptors,
                )
            else:
                channel = grpc.aio.insecure_channel(
                    cfg.controller,
                    options=controller_channel_options(),
                    interceptors=self._client_interceptors,
                )
            self._controller_channel = channel
            self.link = ControllerLink(
                channel,
                cfg.gateway_id,
                cfg.fleet_token,
                self.apply_snapshot,
                self._report_status,
                cfg.report_interval_s,
                report_health=self._report_health,
            )
            self.metrics.dropped_outcomes.read_from(self.link.dropped_total)
            self.link.start()
        else:
            log.warning("no --controller given: the gateway has no fleet and will not be ready")
        log.info(
            "gateway serving",
            extra={
                "grpc": self.host.grpc_address,
                "controller": cfg.controller or "",
                "batching": cfg.batching.value,
            },
        )

    async def run_until_signal(self, after_start: Callable[[], None] | None = None) -> None:
        await self.start()
        if after_start is not None:
            after_start()
        await self.host.serve_until_signal(self.shutdown)

    async def shutdown(self, grace_s: float | None = None) -> None:
        """Finish accepted work within the grace period; answer anything left with a reason."""
        grace = self.config.serving.grace_s if grace_s is None else grace_s
        self._closing = True
        self.host.set_ready(False)
        for d in self.dispatchers.values():
            d.close()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + grace
        # Polling (not an event) because "idle" spans every dispatcher and handler; it runs
        # only during shutdown.
        while loop.time() < give_up and (  # noqa: ASYNC110
            self._inflight or any(d.busy for d in self.dispatchers.values())
        ):
            await asyncio.sleep(0.01)
        abandoned = 0
        for d in self.dispatchers.values():
            abandoned += d.abandon(
                unavailable(Reason.SHUTTING_DOWN, "the gateway shut down before serving", None)
            )
        if abandoned:
            log.warning("shutdown grace ended with work queued", extra={"abandoned": abandoned})
        # Let answered handlers send their responses before the server stops.
        while self._inflight and loop.time() < give_up + 1.0:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self.link is not None:
            await self.link.stop(flush=True)
        for d in self.dispatchers.values():
            await d.stop()
        await self.pool.close_all()
        if self._controller_channel is not None:
            await self._controller_channel.close()

    # -- fleet ------------------------------------------------------------------------------------

    def _dispatcher(self, model: str, version: str) -> VersionDispatcher:
        key = (model, version)
        d = self.dispatchers.get(key)
        if d is None:
            d = VersionDispatcher(
                model,
                version,
                clock=self.clock,
                batcher=make_batcher(
                    self.config.batching,
                    self.clock,
                    BatcherConfig(objective=self.config.objective, linger_s=self.config.linger_s),
                ),
                router=PeakEwmaRouter(SeededRng(next(self._seeds))),
                hedging=HedgePolicy(self.clock),
                pool=self.pool,
                call_metrics=self._execute_metrics,
                fleet_metadata=self._fleet_md,
                on_batch=self._on_batch,
                on_flush=self._on_flush,
                on_hedge=self._on_hedge,
                on_busy=self.metrics.busy_retries.inc,
            )
            d.start()
            self.dispatchers[key] = d
        return d

    def apply_snapshot(
        self, snapshot: control_pb2.WatchFleetResponse, new_stream: bool = False
    ) -> None:
        """Take in a controller snapshot (merged while the controller warms up, ADR 0011)."""
        diff = self.fleet.apply(snapshot, new_stream=new_stream)
        for info in diff.removed:
            d = self.dispatchers.get((info.model, info.version))
            if d is not None:
                d.remove_replica(info.replica_id)
        for info in diff.added + diff.updated:
            d = self._dispatcher(info.model, info.version)
            if info.draining:
                d.drain_replica(info.replica_id)
            else:
                d.upsert_replica(
                    info.replica_id, info.address, info.slots, info.speed, warmup=info.warmup
                )
        if not diff.empty or (new_stream and self.fleet.carried):
            log.info(
                "fleet updated",
                extra={
                    "generation": snapshot.generation,
                    "replicas": len(self.fleet.replicas),
                    "added": [r.replica_id for r in diff.added],
                    "removed": [r.replica_id for r in diff.removed],
                    # Known from before a controller restart, not re-registered yet.
                    "carried_over": sorted(self.fleet.carried),
                },
            )
        routable = any(not r.draining for r in self.fleet.replicas.values())
        self.host.set_ready(routable and not self._closing)
        self.metrics.fleet_replicas.set(len(self.fleet.replicas))

    # -- the Infer path --------------------------------------------------------------------------

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

    # -- callbacks from dispatchers ---------------------------------------------------------------

    def _on_batch(
        self,
        model: str,
        version: str,
        batch: Batch[PendingRequest],
        replica_id: str,
        latency: float,
        ok: bool,
    ) -> None:
        self.metrics.batch_size.observe(len(batch.items))
        if not ok:
            self.metrics.batch_failures.inc()
        if self.link is not None:
            self.link.record_batch(
                control_pb2.BatchOutcome(
                    model=model,
                    version=version,
                    replica_id=replica_id,
                    size=len(batch.items),
                    tokens=batch.tokens,
                    device_time=to_duration(latency if ok else 0.0),
                    ok=ok,
                )
            )

    def _on_flush(self, reason: FlushReason) -> None:
        self.metrics.flushes[reason.value].inc()

    def _on_hedge(self, result: str) -> None:
        self.metrics.hedges[result].inc()

    # -- status -------------------------------------------------------------------------------

    def _report_status(self) -> tuple[int, int, list[fleet_pb2.CostModel]]:
        limiter = self.admission.limiter
        self.metrics.concurrency_limit.set(limiter.limit)
        if limiter.short_latency_s is not None and limiter.long_latency_s is not None:
            self.metrics.limiter_short.set(limiter.short_latency_s)
            self.metrics.limiter_long.set(limiter.long_latency_s)
        self.metrics.inflight.set(self._inflight)
        self.metrics.queued.set(sum(d.batcher.depth for d in self.dispatchers.values()))
        if self.link is not None:
            self.metrics.controller_connected.set(1 if self.link.connected else 0)
        models = []
        for d in self.dispatchers.values():
            for rid in d.replicas:
                cost = d.cost_model(rid)
                if cost is None:
                    continue
                models.append(
                    fleet_pb2.CostModel(
                        replica_id=rid,
                        intercept=to_duration(cost.intercept),
                        per_token=to_duration(cost.slope),
                        samples=cost.observations,
                        per_step=to_duration(cost.step),
                    )
                )
        return limiter.limit, self._inflight, models

    def _report_health(self) -> GatewayHealth:
        """Breakers, sheds and tenants for the controller link's report (once per report)."""
        now = self.clock.now()
        breakers = [
            (view.replica_id, view.breaker)
            for d in self.dispatchers.values()
            for view in d.router.views(now)
        ]
        totals = self.metrics.tenant_totals()
        tenants = {t.name: totals.get(t.name, TenantTotals()) for t in self.tenants}
        return GatewayHealth(breakers, self.metrics.shed_totals(), tenants)

    def _take_snapshot(self) -> GatewaySnapshot:
        """What the gateway exports at scrape time; runs on the loop (``LoopSnapshot``)."""
        now = self.clock.now()
        self._report_status()  # keeps the scalar gauges fresh at scrape time too
        snap = GatewaySnapshot()
        for (model, version), d in self.dispatchers.items():
            views = {v.replica_id: v for v in d.router.views(now)}
            routable = 0
            for rid in d.replicas:
                view = views.get(rid)
                cost = d.cost_model(rid)
                breaker = view.breaker if view else BreakerState.CLOSED
                if view is not None and not view.draining and breaker is not BreakerState.OPEN:
                    routable += 1
                snap.replicas.append(
                    ReplicaSample(
                        replica_id=rid,
                        version=version,
                        inflight=view.inflight if view else 0,
                        latency_estimate_s=view.latency_estimate_s if view else 0.0,
                        cost_intercept_s=cost.intercept if cost else math.nan,
                        cost_per_token_s=cost.slope if cost else math.nan,
                        breaker=breaker.value,
                        cost_per_step_s=cost.step if cost else math.nan,
                    )
                )
            snap.routable[(model, version)] = routable
        for model, split in self.fleet.splits.items():
            canary = split.canary_weight_bp / BUCKETS if split.canary_version else 0.0
            snap.weights[(model, split.stable_version)] = 1.0 - canary
            snap.routable.setdefault((model, split.stable_version), 0)
            if split.canary_version:
                snap.weights[(model, split.canary_version)] = canary
                snap.routable.setdefault((model, split.canary_version), 0)
        quotas = self.admission.quotas
        for tenant in self.tenants:
            snap.quota_tokens[tenant.name] = quotas.available(tenant, now)
        return snap


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
