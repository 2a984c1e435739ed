"""Status and reporting: what the gateway tells the controller and its scrapes about itself.

What it decides: which numbers leave the gateway and when — each batch's outcome (the
controller's cost and canary evidence), the limiter, in-flight and queue figures plus every
replica's fitted cost model for the controller link's status report, breakers, sheds and tenant
totals for its health report, and the per-replica, weight and quota view taken at scrape time.
Why apart: none of it changes how a request is served; it only reads the state the Infer path
and the fleet view keep, as :class:`StatusReport`, a part of :class:`gateway.app.GatewayApp`.
"""

from __future__ import annotations

import math

from common.clock import Clock
from common.durations import to_duration
from gateway.admission import (
    AdmissionController,
    TenantRegistry,
)
from gateway.admission.quota_shares import QuotaShares
from gateway.batching import Batch, FlushReason
from gateway.controller_link import ControllerLink, GatewayHealth
from gateway.dispatcher import (
    PendingRequest,
    VersionDispatcher,
)
from gateway.fleet_state import FleetState
from gateway.metrics import (
    GatewayMetrics,
    GatewaySnapshot,
    ReplicaSample,
    TenantTotals,
)
from gateway.routing import BreakerState
from gateway.versioning import BUCKETS
from halcyon.v1 import control_pb2, fleet_pb2


class StatusReport:
    """Reporting for :class:`gateway.app.GatewayApp` (which sets every attribute)."""

    clock: Clock
    metrics: GatewayMetrics
    tenants: TenantRegistry
    admission: AdmissionController
    quota_shares: QuotaShares
    fleet: FleetState
    dispatchers: dict[tuple[str, str], VersionDispatcher]
    link: ControllerLink | None
    _inflight: int

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
        """Breakers, sheds, tenants and quota demand for the controller link's report (once
        per report; an expired quota lease is noticed here too)."""
        now = self.clock.now()
        self.quota_shares.refresh(now)
        breakers = [
            (view.replica_id, view.breaker)
            for d in self.dispatchers.values()
            for view in d.router.views(now)
        ]
        totals = self.metrics.tenant_totals()
        tenants = {t.name: totals.get(t.name, TenantTotals()) for t in self.tenants}
        demands = list(self.quota_shares.demands(now))
        return GatewayHealth(breakers, self.metrics.shed_totals(), tenants, demands)

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
        snap.quota_shares = self.quota_shares.shares()
        return snap
