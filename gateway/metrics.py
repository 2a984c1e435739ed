"""The gateway's domain metrics (``halcyon_gateway_*``), registered on the host's registry.

What it decides: what an operator sees of the four decisions — requests by outcome, sheds by
reason, batch sizes and flush reasons, the adaptive limit, hedges — with small fixed label
domains. Per-replica state (latency estimate, cost-model coefficients, inflight) is read at
scrape time by a collector instead of being pushed on every request, so the data path pays
nothing for it; its ``replica`` label is bounded by the fleet size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.buffered_metrics import BufferedCounter, LoopHistogram, ScrapeHooks

__all__ = ["REQUEST_OUTCOMES", "GatewayMetrics", "ReplicaSample"]

# Every way an Infer call can end (the ``outcome`` label): ``ok``, ``cancelled`` (the client
# went away) or the lower-cased ErrorInfo reason, except three groupings: MISSING_CREDENTIALS
# and INVALID_CREDENTIALS count as ``unauthenticated``, INVALID_FIELD as ``invalid_argument``,
# and OVERLOADED with ``shed=goodput`` as ``shed_for_goodput`` (README "Metrics"; a test keeps
# the two in step).
REQUEST_OUTCOMES = (
    "ok",
    "invalid_argument",
    "unauthenticated",
    "wrong_role",
    "unknown_model",
    "quota_exceeded",
    "overloaded",
    "queue_full",
    "no_capacity",
    "deadline_unreachable",
    "deadline_missed",
    "shed_for_goodput",
    "upstream_failure",
    "internal",
    "shutting_down",
    "cancelled",
)
SHED_REASONS = (
    "quota_exceeded",
    "overloaded",
    "queue_full",
    "no_capacity",
    "deadline_unreachable",
    "deadline_missed",
    "shed_for_goodput",
)
FLUSH_REASONS = ("deadline", "full", "linger", "capacity", "drain")
HEDGE_RESULTS = ("fired", "won", "lost", "declined")

_LATENCY_BUCKETS = (
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
)  # fmt: skip
_SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One replica's state at scrape time."""

    replica_id: str
    version: str
    inflight: int
    latency_estimate_s: float
    cost_intercept_s: float
    cost_per_token_s: float


class _ReplicaCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[ReplicaSample]]) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["replica", "version"]
        latency = GaugeMetricFamily(
            "halcyon_gateway_replica_latency_estimate_seconds",
            "Peak-EWMA latency estimate per replica (the router's view).",
            labels=labels,
        )
        inflight = GaugeMetricFamily(
            "halcyon_gateway_replica_inflight", "Batches in flight per replica.", labels=labels
        )
        intercept = GaugeMetricFamily(
            "halcyon_gateway_cost_model_intercept_seconds",
            "Learned fixed cost per batch, per replica.",
            labels=labels,
        )
        per_token = GaugeMetricFamily(
            "halcyon_gateway_cost_model_per_token_seconds",
            "Learned marginal cost per token, per replica.",
            labels=labels,
        )
        for s in self._source():
            key = [s.replica_id, s.version]
            latency.add_metric(key, s.latency_estimate_s)
            inflight.add_metric(key, s.inflight)
            intercept.add_metric(key, s.cost_intercept_s)
            per_token.add_metric(key, s.cost_per_token_s)
        yield from (latency, inflight, intercept, per_token)


class GatewayMetrics:
    """``halcyon_gateway_*`` families, with children pre-bound for the hot path."""

    def __init__(self, registry: CollectorRegistry, hooks: ScrapeHooks) -> None:
        """``hooks`` flush the buffered counters; registered in ``registry`` before this."""

        def labeled(
            name: str, doc: str, label: str, values: tuple[str, ...]
        ) -> dict[str, BufferedCounter]:
            # Every child exists from the start, so rate() queries work before the first event.
            family = Counter(name, doc, [label], registry=registry)
            counters = {v: BufferedCounter(family.labels(v)) for v in values}
            hooks.add_counters(counters.values())
            return counters

        self.requests = labeled(
            "halcyon_gateway_requests",
            "Infer calls by how they ended (ok or the ErrorInfo reason, lower-cased).",
            "outcome",
            REQUEST_OUTCOMES,
        )
        self.shed = labeled(
            "halcyon_gateway_shed",
            "Requests refused or dropped by the gateway, by reason.",
            "reason",
            SHED_REASONS,
        )
        self.flushes = labeled(
            "halcyon_gateway_batch_flushes",
            "Dispatched batches by flush reason.",
            "reason",
            FLUSH_REASONS,
        )
        self.hedges = labeled(
            "halcyon_gateway_hedges",
            "Hedged dispatches: fired, won (the hedge answered first), lost, declined.",
            "result",
            HEDGE_RESULTS,
        )
        self.latency = LoopHistogram(  # observed once per request, on the event loop
            "halcyon_gateway_request_seconds",
            "Latency of successful Infer calls, receipt to answer.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "halcyon_gateway_batch_size",
            "Requests per dispatched batch.",
            buckets=_SIZE_BUCKETS,
            registry=registry,
        )
        self.busy_retries = Counter(
            "halcyon_gateway_busy_retries",
            "Batches re-routed because a replica answered REPLICA_BUSY (backpressure).",
            registry=registry,
        )
        self.batch_failures = Counter(
            "halcyon_gateway_batch_failures",
            "Batches that failed on a replica (faults, not backpressure).",
            registry=registry,
        )
        self.concurrency_limit = Gauge(
            "halcyon_gateway_concurrency_limit",
            "Current adaptive concurrency limit (gradient limiter).",
            registry=registry,
        )
        self.inflight = Gauge(
            "halcyon_gateway_inflight", "Admitted requests not yet answered.", registry=registry
        )
        self.queued = Gauge(
            "halcyon_gateway_queued", "Requests waiting in the batchers.", registry=registry
        )
        self.fleet_replicas = Gauge(
            "halcyon_gateway_fleet_replicas",
            "Replicas in the gateway's fleet view.",
            registry=registry,
        )
        self.controller_connected = Gauge(
            "halcyon_gateway_controller_connected",
            "1 while the fleet stream from the controller is up.",
            registry=registry,
        )
        self.dropped_reports = Gauge(
            "halcyon_gateway_dropped_outcome_reports",
            "Outcome reports dropped because the controller was unreachable too long.",
            registry=registry,
        )
        self._registry = registry

    def watch_replicas(self, source: Callable[[], Iterable[ReplicaSample]]) -> None:
        self._registry.register(_ReplicaCollector(source))
