"""The gateway's domain metrics (``halcyon_gateway_*``), registered on the host's registry.

What it decides: what an operator sees of the four decisions — requests, outcomes, goodput and
latency per tenant, model and version; sheds by reason and priority; batch sizes and flush
reasons; the adaptive limit; hedges; and, read at scrape time, each replica's routing state,
each tenant's quota balance, each model's version weights and the outcomes the controller link
dropped (a counter whose count the link keeps: :class:`RunningTotal`).

Label domains stay small and fixed (design section 6): ``tenant`` is a configured tenant's name
(``none`` before a key matched), ``model`` a model the fleet serves (``unknown`` for any other
name a client sends — client input never becomes a label), ``version`` a version the controller
routes to (``none`` before one was chosen), ``outcome``, ``reason`` and ``priority`` fixed
enumerations. Per-request cost: one dict lookup for the (tenant, model, version)
:class:`RequestSeries` at admission, then plain-int increments and one bisect (ADR 0014).

The counters are also the one count the controller link reports (once per report, on the
loop): :meth:`GatewayMetrics.shed_totals` (sheds by reason) and
:meth:`GatewayMetrics.tenant_totals` (each tenant's calls by how they ended) read the buffered
counts, cumulative since the gateway started, so there is no second tally to drift.

Scrape-time state is computed on the event loop that owns it (:class:`LoopSnapshot`): the
router's breakers and the quota buckets change state when read, and must not be read from the
HTTP server's thread while the loop mutates them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from common.buffered_metrics import BufferedCounter, LoopHistogram, ScrapeHooks

__all__ = [
    "NO_TENANT",
    "NO_VERSION",
    "PRIORITIES",
    "REQUEST_OUTCOMES",
    "SHED_REASONS",
    "UNKNOWN_MODEL",
    "GatewayMetrics",
    "GatewaySnapshot",
    "LoopSnapshot",
    "ReplicaSample",
    "RequestSeries",
    "RunningTotal",
    "TenantTotals",
]

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
PRIORITIES = ("critical", "standard", "sheddable")
FLUSH_REASONS = ("deadline", "full", "linger", "capacity", "drain")
HEDGE_RESULTS = ("fired", "won", "lost", "declined")
BREAKER_STATES = ("closed", "open", "half_open")
NO_TENANT = "none"  # no API key matched (yet)
UNKNOWN_MODEL = "unknown"  # a model name the fleet does not serve
NO_VERSION = "none"  # refused before a version was chosen
# Outcomes of requests that never got past admission (validation, quota, the limiter).
_REFUSED_AT_ADMISSION = frozenset(
    {"invalid_argument", "unauthenticated", "wrong_role", "unknown_model", "quota_exceeded",
     "overloaded", "shutting_down"}
)  # fmt: skip
_FAILED = frozenset({"upstream_failure", "internal"})

_LATENCY_BUCKETS = (
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
)  # fmt: skip
_SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)

T = TypeVar("T")


class _Observer(Protocol):
    def observe(self, value: float) -> None: ...


class RequestSeries:
    """The request metrics of one (tenant, model, version), bound once and kept.

    ``outcomes`` has every outcome from the start (rate() works before the first error);
    ``latency`` and ``goodput`` count answered requests only.
    """

    __slots__ = ("goodput", "latency", "outcomes")

    def __init__(
        self,
        outcomes: dict[str, BufferedCounter],
        goodput: BufferedCounter,
        latency: _Observer,
    ) -> None:
        self.outcomes = outcomes
        self.goodput = goodput
        self.latency = latency

    def answered(self, latency_s: float, on_time: bool) -> None:
        """An OK answer after ``latency_s``; ``on_time`` when it met its deadline (goodput)."""
        self.outcomes["ok"].inc()
        self.latency.observe(latency_s)
        if on_time:
            self.goodput.inc()


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One replica's routing state."""

    replica_id: str
    version: str
    inflight: int
    latency_estimate_s: float
    cost_intercept_s: float
    cost_per_token_s: float
    breaker: str = "closed"
    cost_per_step_s: float = 0.0


@dataclass(slots=True)
class GatewaySnapshot:
    """Everything the gateway exports that is read rather than counted, taken on the loop."""

    replicas: list[ReplicaSample] = field(default_factory=list)
    # (model, version) -> replicas the router may send new batches to (not draining, breaker
    # not open); every version the controller routes to is present, 0 when none is left.
    routable: dict[tuple[str, str], int] = field(default_factory=dict)
    # (model, version) -> share of new sessions, 0..1, as the gateway applies it.
    weights: dict[tuple[str, str], float] = field(default_factory=dict)
    # tenant -> tokens of predicted work in its bucket now (negative while paying off).
    quota_tokens: dict[str, float] = field(default_factory=dict)
    # tenant -> (work tokens per second this gateway holds it to, where that share comes from).
    quota_shares: dict[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(slots=True)
class TenantTotals:
    """One tenant's Infer calls so far, summed over models and versions (cumulative)."""

    requests: int = 0
    admitted: int = 0
    quota_refused: int = 0
    shed: int = 0
    ok: int = 0
    errors: int = 0

    def add(self, other: TenantTotals) -> None:
        self.requests += other.requests
        self.admitted += other.admitted
        self.quota_refused += other.quota_refused
        self.shed += other.shed
        self.ok += other.ok
        self.errors += other.errors


class LoopSnapshot(Generic[T]):
    """A value computed on the event loop that owns its inputs, read from any thread.

    From the loop's own thread it is computed at once; from another (the metrics HTTP
    server's) the computation is handed to the loop and awaited for at most ``timeout_s`` —
    a loop too busy or wedged to answer yields the previous value instead of a torn read.
    """

    def __init__(self, compute: Callable[[], T], initial: T, timeout_s: float = 1.0) -> None:
        self._compute = compute
        self._last = initial
        self._timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def read(self) -> T:
        loop = self._loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if loop is None or on_loop or loop.is_closed():
            self._last = self._compute()
            return self._last
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def compute() -> None:
            try:
                future.set_result(self._compute())
            except BaseException as exc:
                future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(compute)
            self._last = future.result(self._timeout_s)
        except (RuntimeError, concurrent.futures.TimeoutError):
            pass  # loop closed or not answering: the previous value
        return self._last


class _SnapshotCollector(Collector):
    def __init__(self, snapshot: LoopSnapshot[GatewaySnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed on the loop: never at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._snapshot.read()
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
        per_step = GaugeMetricFamily(
            "halcyon_gateway_cost_model_per_step_seconds",
            "Learned cost per decode step of a batch's longest output, per replica.",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            "halcyon_gateway_replica_breaker_state",
            "Circuit breaker state per replica: 1 for the current state, 0 for the others.",
            labels=[*labels, "state"],
        )
        for s in snap.replicas:
            key = [s.replica_id, s.version]
            latency.add_metric(key, s.latency_estimate_s)
            inflight.add_metric(key, s.inflight)
            intercept.add_metric(key, s.cost_intercept_s)
            per_token.add_metric(key, s.cost_per_token_s)
            per_step.add_metric(key, s.cost_per_step_s)
            for state in BREAKER_STATES:
                breaker.add_metric([*key, state], 1.0 if s.breaker == state else 0.0)
        routable = GaugeMetricFamily(
            "halcyon_gateway_routable_replicas",
            "Replicas that may take new batches (not draining, breaker not open), per version.",
            labels=["model", "version"],
        )
        for (model, version), n in sorted(snap.routable.items()):
            routable.add_metric([model, version], n)
        weight = GaugeMetricFamily(
            "halcyon_gateway_version_weight",
            "Share of new sessions the gateway sends to each version (0..1), from the "
            "controller's rollout weights.",
            labels=["model", "version"],
        )
        for (model, version), w in sorted(snap.weights.items()):
            weight.add_metric([model, version], w)
        quota = GaugeMetricFamily(
            "halcyon_gateway_quota_available_tokens",
            "Tokens of predicted work left in each tenant's quota bucket.",
            labels=["tenant"],
        )
        for tenant, tokens in sorted(snap.quota_tokens.items()):
            quota.add_metric([tenant], tokens)
        share = GaugeMetricFamily(
            "halcyon_gateway_quota_share_per_second",
            "Work tokens per second this gateway admits for each tenant, and where the share "
            "comes from: the controller's lease, the fallback after a lease expired "
            "(contract / gateways known), the initial share before any lease (contract / "
            "--expected-gateways), or the configured quota (a lone gateway).",
            labels=["tenant", "source"],
        )
        for tenant, (rate, source) in sorted(snap.quota_shares.items()):
            share.add_metric([tenant, source], rate)
        yield from (
            latency,
            inflight,
            intercept,
            per_token,
            per_step,
            breaker,
            routable,
            weight,
            quota,
            share,
        )


class RunningTotal(Collector):
    """A counter family whose count another object keeps: ``read`` at every scrape.

    For a total with one owner that is not a metrics object (the controller link's dropped
    outcomes, counted where they are dropped, on the data path, as a plain int): exported as
    a Prometheus counter (``<name>_total``) without a second copy of the count to keep in step.
    ``read`` must be callable from the metrics HTTP server's thread (reading an int attribute
    is) and never decrease. 0 until :meth:`read_from` names a source.
    """

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._read: Callable[[], float] = lambda: 0
        registry.register(self)

    def read_from(self, read: Callable[[], float]) -> None:
        self._read = read

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())


class GatewayMetrics:
    """``halcyon_gateway_*`` families, with children pre-bound for the hot path."""

    def __init__(self, registry: CollectorRegistry, hooks: ScrapeHooks) -> None:
        """``hooks`` flush the buffered counters; registered in ``registry`` before this."""
        self._hooks = hooks

        def labeled(
            name: str, doc: str, label: str, values: tuple[str, ...]
        ) -> dict[str, BufferedCounter]:
            # Every child exists from the start, so rate() queries work before the first event.
            family = Counter(name, doc, [label], registry=registry)
            counters = {v: BufferedCounter(family.labels(v)) for v in values}
            hooks.add_counters(counters.values())
            return counters

        self._requests = Counter(
            "halcyon_gateway_requests",
            "Infer calls by tenant, model, version and how they ended (ok or the ErrorInfo "
            "reason, lower-cased).",
            ["tenant", "model", "version", "outcome"],
            registry=registry,
        )
        self._goodput = Counter(
            "halcyon_gateway_goodput",
            "Infer calls answered OK within their deadline, by tenant, model and version.",
            ["tenant", "model", "version"],
            registry=registry,
        )
        self._latency = LoopHistogram(  # observed once per request, on the event loop
            "halcyon_gateway_request_seconds",
            "Latency of successful Infer calls, receipt to answer, by tenant, model and version.",
            ["tenant", "model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._series: dict[tuple[str, str, str], RequestSeries] = {}
        shed = Counter(
            "halcyon_gateway_shed",
            "Requests refused or dropped by the gateway, by reason and (effective) priority.",
            ["reason", "priority"],
            registry=registry,
        )
        self.shed: dict[tuple[str, str], BufferedCounter] = {
            (r, p): BufferedCounter(shed.labels(r, p)) for r in SHED_REASONS for p in PRIORITIES
        }
        hooks.add_counters(self.shed.values())
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
        limiter_latency = Gauge(
            "halcyon_gateway_limiter_latency_seconds",
            "The latencies the concurrency limit is judged on: the last judged window's mean "
            "(short) and the un-queued level it is compared with (long).",
            ["window"],
            registry=registry,
        )
        self.limiter_short = limiter_latency.labels("short")
        self.limiter_long = limiter_latency.labels("long")
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
        # The count is the controller link's (one owner); the family reads it at scrape time.
        self.dropped_outcomes = RunningTotal(
            "halcyon_gateway_dropped_outcome_reports",
            "Outcomes (request and batch) dropped before the controller acknowledged them: the "
            "report buffer overflowed while the controller was unreachable.",
            registry,
        )
        self._registry = registry

    def series(self, tenant: str, model: str, version: str) -> RequestSeries:
        """The bound request metrics of (tenant, model, version); created on first use.

        Callers keep label values inside their domains (module docstring): the number of
        series is the product of configured tenants, served models and routed versions.
        """
        key = (tenant, model, version)
        series = self._series.get(key)
        if series is None:
            outcomes = {
                o: BufferedCounter(self._requests.labels(tenant, model, version, o))
                for o in REQUEST_OUTCOMES
            }
            goodput = BufferedCounter(self._goodput.labels(tenant, model, version))
            self._hooks.add_counters([*outcomes.values(), goodput])
            series = RequestSeries(outcomes, goodput, self._latency.labels(tenant, model, version))
            self._series[key] = series
        return series

    def count_shed(self, reason: str, priority: str) -> None:
        counter = self.shed.get((reason, priority))
        if counter is not None:
            counter.inc()

    def shed_totals(self) -> dict[str, int]:
        """Requests shed so far by reason, summed over priorities (cumulative; read on the
        loop, once per report — the counters stay the one count)."""
        totals = dict.fromkeys(SHED_REASONS, 0)
        for (reason, _), counter in self.shed.items():
            totals[reason] += counter.count
        return totals

    def tenant_totals(self) -> dict[str, TenantTotals]:
        """Each tenant's Infer calls so far, from the request counters (cumulative; read on the
        loop, once per report). Calls with no tenant (no API key matched) are not a tenant's."""
        totals: dict[str, TenantTotals] = {}
        for (tenant, _, _), series in self._series.items():
            if tenant == NO_TENANT:
                continue
            entry = totals.setdefault(tenant, TenantTotals())
            for outcome, counter in series.outcomes.items():
                n = counter.count
                if not n:
                    continue
                entry.requests += n
                if outcome not in _REFUSED_AT_ADMISSION:
                    entry.admitted += n
                if outcome == "quota_exceeded":
                    entry.quota_refused += n
                elif outcome in SHED_REASONS:
                    entry.shed += n
                elif outcome == "ok":
                    entry.ok += n
                elif outcome in _FAILED:
                    entry.errors += n
        return totals

    def watch(self, snapshot: LoopSnapshot[GatewaySnapshot]) -> None:
        """Export ``snapshot`` (replicas, routable versions, weights, quotas) at every scrape."""
        self._registry.register(_SnapshotCollector(snapshot))
