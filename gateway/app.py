"""The gateway process: configuration, lifecycle, fleet view and the two Infer transports.

What it decides: how a gateway starts (host, controller link), takes in the controller's fleet
snapshots (soft state: when the controller is away the gateway keeps serving on the last one),
and shuts down — SIGTERM: readiness off, new requests refused with ``UNAVAILABLE /
SHUTTING_DOWN``, queued and in-flight work finishes within the grace period, and anything still
queued after it gets a typed answer. No accepted request goes unanswered.

Where the rest lives (re-exported here, the place existing code imports from):

* :mod:`gateway.infer_path` — the Infer path (``admit``, ``settle`` and what they call): the
  order of admission, version, batching and routing, and how each outcome is charged back.
* :mod:`gateway.status_report` — batch outcomes, status and health reports to the controller,
  and the scrape-time snapshot.

The two transport adapters (:class:`InferServicer`, :class:`RawInferAdapter`) stay here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError
from opentelemetry import trace
from prometheus_client import Gauge

from common.auth import AuthPolicy, bearer_metadata
from common.backoff import controller_channel_options
from common.clock import Clock, MonotonicClock
from common.errors import (
    Reason,
    RichError,
    abort,
    unavailable,
    undecodable,
)
from common.grpc_metrics import ClientMetricsInterceptors, GrpcClientMetrics, UnaryClientRecorder
from common.raw_unary import RawCall, RawUnaryEndpoint
from common.rng import SeededRng
from common.serving import ServiceHost
from common.tracing import client_interceptors, end_rpc_span, spans_recorded, start_server_span
from gateway.admission import (
    AdmissionController,
    GradientLimiter,
    PriorityShedder,
    TenantQuotas,
)
from gateway.answer_guard import AnswerGuard
from gateway.batching import BatcherConfig
from gateway.batching.fixed import make_batcher
from gateway.config import GatewayConfig
from gateway.controller_link import ControllerLink
from gateway.dispatcher import (
    EXECUTE_BATCH_METHOD,
    PendingRequest,
    VersionDispatcher,
)
from gateway.fleet_state import FleetState
from gateway.infer_path import (
    _ERROR,
    _LATE,
    _OK,
    _PRIORITY,
    _QUEUE_SHED_REASONS,
    _SHED,
    _SHED_REASONS,
    ANSWER_GRACE_S,
    INFER_METHOD,
    SERVICE_NAME,
    Admitted,
    InferPath,
    _effective_priority,
    _expire,
    _outcome_label,
    _queue_shed_budget,
    _response,
    internal_error,
)
from gateway.metrics import (
    GatewayMetrics,
    GatewaySnapshot,
    LoopSnapshot,
)
from gateway.routing import HedgePolicy, PeakEwmaRouter
from gateway.status_report import StatusReport
from gateway.worker_pool import WorkerPool
from halcyon.v1 import control_pb2, infer_pb2, infer_pb2_grpc

__all__ = [
    "ANSWER_GRACE_S",
    "INFER_METHOD",
    "MAX_INFER_REQUEST_BYTES",
    "SERVICE_NAME",
    "_ERROR",
    "_LATE",
    "_OK",
    "_PRIORITY",
    "_QUEUE_SHED_REASONS",
    "_SHED",
    "_SHED_REASONS",
    "Admitted",
    "GatewayApp",
    "GatewayConfig",
    "InferPath",
    "InferServicer",
    "RawInferAdapter",
    "StatusReport",
    "_effective_priority",
    "_expire",
    "_outcome_label",
    "_queue_shed_budget",
    "_response",
    "internal_error",
]

log = logging.getLogger("halcyon.gateway")

# Twice the largest valid InferRequest (64 KiB of input plus small fields): anything bigger is
# refused unparsed with RESOURCE_EXHAUSTED / MESSAGE_TOO_LARGE.
MAX_INFER_REQUEST_BYTES = 128 * 1024


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


class GatewayApp(InferPath, StatusReport):
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
