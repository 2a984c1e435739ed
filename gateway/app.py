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

* :mod:`gateway.infer_adapter` — Infer's one adapter, used by both transports (the
  completion queue and ``grpc.aio``) behind the host's unary pipeline.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable

import grpc
from prometheus_client import Gauge

from common.auth import AuthPolicy, bearer_metadata
from common.backoff import controller_channel_options
from common.clock import Clock, MonotonicClock
from common.controller_targets import ControllerTargets
from common.durations import to_seconds
from common.errors import Reason, unavailable
from common.grpc_metrics import ClientMetricsInterceptors, GrpcClientMetrics, UnaryClientRecorder
from common.rng import SeededRng
from common.serving import ServiceHost
from common.tracing import client_interceptors
from gateway.admission import (
    AdmissionController,
    GradientLimiter,
    PriorityShedder,
    TenantQuotas,
)
from gateway.admission.quota_shares import QuotaShares
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
from gateway.infer_adapter import InferAdapter, tenant_check
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
from gateway.replicas import Change, Insert
from gateway.routing import HedgePolicy, PeakEwmaRouter
from gateway.status_report import StatusReport
from gateway.worker_pool import WorkerPool
from halcyon.v1 import control_pb2, infer_pb2

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
    "InferAdapter",
    "InferPath",
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
        quotas = TenantQuotas(config.tenants)
        self.admission = AdmissionController(
            quotas,
            GradientLimiter(config.limiter, now=self.clock.now()),
            PriorityShedder(),
        )
        # Each tenant's share of its fleet-wide quota: leases from the fleet snapshots,
        # re-checked with every report (ADR 0003).
        self.quota_shares = QuotaShares(
            config.tenants,
            quotas,
            expected_gateways=config.expected_gateways,
            now=self.clock.now(),
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
        # Membership changes reach the pool before the dispatchers (and leave in reverse): a
        # replica's channel is open before a router can pick it, closed after none can.
        self.fleet.replicas.subscribe(self.pool.changed)
        self.fleet.replicas.subscribe(self._replica_changed)
        self.link: ControllerLink | None = None
        self._controller_channel: grpc.aio.Channel | None = None
        self._fleet_md = bearer_metadata(config.fleet_token) if config.fleet_token else ()
        self._ids = itertools.count(1)
        self._id_prefix = config.gateway_id
        self._seeds = itertools.count(config.seed)
        self._closing = False
        self._inflight = 0
        self._guard: AnswerGuard[PendingRequest] | None = None
        # Infer off its own completion queue where it may attach (ADR 0006), else grpc.aio:
        # one adapter, behind the host's pipeline, either way.
        self.host.add_unary(
            INFER_METHOD,
            InferAdapter(self),
            deserializer=infer_pb2.InferRequest.FromString,
            max_request_bytes=MAX_INFER_REQUEST_BYTES,
            tenant_check=functools.partial(tenant_check, self),
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def _controller_channel_to(self, target: str) -> grpc.aio.Channel:
        tls = self.config.controller_tls
        if tls is not None:
            return grpc.aio.secure_channel(
                target,
                tls.channel_credentials(),
                options=controller_channel_options(),
                interceptors=self._client_interceptors,
            )
        return grpc.aio.insecure_channel(
            target, options=controller_channel_options(), interceptors=self._client_interceptors
        )

    async def start(self) -> None:
        self._snapshot.bind(asyncio.get_running_loop())
        await self.host.start()
        cfg = self.config
        if cfg.controller:
            targets = ControllerTargets(cfg.controller)
            channel = self._controller_channel_to(targets.current)
            self._controller_channel = channel
            self.link = ControllerLink(
                channel,
                cfg.gateway_id,
                cfg.fleet_token,
                self.apply_snapshot,
                self._report_status,
                cfg.report_interval_s,
                report_health=self._report_health,
                targets=targets,
                channel_for=self._controller_channel_to,
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

    def _replica_changed(self, change: Change) -> None:
        """A membership change goes to its (model, version)'s dispatcher, made on first join."""
        key = (change.replica.model, change.replica.version)
        d = self._dispatcher(*key) if isinstance(change, Insert) else self.dispatchers.get(key)
        if d is not None:
            d.changed(change)

    def apply_snapshot(
        self, snapshot: control_pb2.WatchFleetResponse, new_stream: bool = False
    ) -> None:
        """Take in a controller snapshot (merged while the controller warms up, ADR 0011); the
        fleet state's owner of membership tells the pool and the dispatchers what changed."""
        diff = self.fleet.apply(snapshot, new_stream=new_stream)
        if snapshot.quota_leases:
            now = self.clock.now()
            for lease in snapshot.quota_leases:
                self.quota_shares.apply(
                    lease.tenant,
                    lease.rate_per_s,
                    lease.burst,
                    to_seconds(lease.ttl),
                    lease.gateways_known,
                    now,
                )
            self.quota_shares.refresh(now)
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
