"""Outcome evidence from the gateways: what happened to requests of each (model, version).

What it decides: how ``ReportOutcomes`` reports are validated and summarised. Per (model,
version) it counts requests by how they ended (ok / error / shed / late) and keeps a latency
histogram of the *answered* ones (ok and late: errors and shed requests have no meaningful
latency and must not make an arm look fast), plus batch counts, over a rolling window of
``window_s`` seconds made of ``slots`` time slots. Per gateway it keeps the latest status
(report time, adaptive concurrency limit, in-flight requests, learned cost models) for
GetState, forgetting gateways silent for longer than ``gateway_ttl_s``.

Every request is counted once with its own kind — a failed batch of 8 is 8 errors, and shed
requests count against the version they were assigned to (defect 4 of the original). The
rolling window is what GetState shows; rollouts judge their own evidence (below), so
pre-rollout traffic is never judged (defect 3).

Validation is per item, never per report: one malformed outcome (no model, no version, an
unknown kind, a latency or device time that is negative, malformed or beyond
:data:`MAX_REPORTED_S`, a model, version or replica id longer than the registry's limits) is
dropped and counted by reason in the returned :class:`IngestResult`, and every well-formed
outcome of the same report is still counted. A report is a second of a gateway's evidence;
rejecting all of it for one bad item would throw good evidence away with the bad (the defect
this replaced). A report with no ``gateway_id`` (or one longer than
:data:`controller.registry.MAX_ID_CHARS`) still has its outcomes counted; only the gateway
status is skipped. A reported cost model with a too-long replica id or a Duration out of range
is dropped the same way (reason ``invalid_cost_model``): GetState shows cost models as
they came, and a Duration no JSON printer can render would break GetState for everyone.

The rest of a gateway's status — its breaker per replica, requests shed by reason and traffic
per tenant, the last two cumulative since that gateway started — is kept as it came, item by
item under the same rule: a breaker with a replica id that is empty or too long, or a state
that is unset or unknown (``invalid_breaker``); a shed count whose reason is empty or longer
than :data:`MAX_REASON_CHARS` (``invalid_shed_count``); a tenant whose name is empty or longer
than :data:`controller.registry.MAX_NAME_CHARS` (``invalid_tenant``); a second item with the
same replica, reason or tenant, or more items than :data:`MAX_BREAKERS`,
:data:`MAX_SHED_REASONS` or :data:`MAX_TENANTS` allow (same reasons) — each is dropped and
counted, and the rest of the status is kept. A gateway silent for ``gateway_ttl_s`` is
forgotten with all of it.

Rollout evidence is not read from the rolling window: a ``tap`` (see
:class:`controller.rollout_evidence.RolloutEvidence`) sees every accepted request outcome as it
is ingested, so each rollout accumulates its own per-arm deltas from its own start. Pure and
clock-injected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from common.clock import Clock
from common.durations import DurationOutOfRange, checked_seconds
from common.histogram import LatencyHistogram
from controller.registry import MAX_ID_CHARS, MAX_NAME_CHARS, identifier_problem
from halcyon.v1 import control_pb2, fleet_pb2

__all__ = [
    "ANSWERED_KINDS",
    "DROP_REASONS",
    "KIND_NAMES",
    "MAX_REPORTED_S",
    "GatewayReport",
    "IngestResult",
    "OutcomeAggregator",
    "OutcomeTap",
    "VersionOutcomes",
    "check_batch",
    "check_breaker",
    "check_cost_model",
    "check_request",
    "check_shed_count",
    "check_tenant",
]

Kind = control_pb2.RequestOutcomeKind
# Small fixed label domain for metrics and summaries.
KIND_NAMES: dict[int, str] = {
    Kind.REQUEST_OUTCOME_KIND_OK: "ok",
    Kind.REQUEST_OUTCOME_KIND_ERROR: "error",
    Kind.REQUEST_OUTCOME_KIND_SHED: "shed",
    Kind.REQUEST_OUTCOME_KIND_LATE: "late",
}
# Outcomes that carry a latency worth counting (answered, on time or late).
ANSWERED_KINDS = (Kind.REQUEST_OUTCOME_KIND_OK, Kind.REQUEST_OUTCOME_KIND_LATE)
# Why an outcome was not counted: a small fixed label domain for the dropped-outcomes metric.
DROP_REASONS = (
    "missing_model",
    "missing_version",
    "invalid_kind",
    "invalid_latency",
    "series_limit",
    "invalid_identifier",
    "invalid_device_time",
    "invalid_cost_model",
    "invalid_breaker",
    "invalid_shed_count",
    "invalid_tenant",
)
# The longest latency or device time a report may carry (no request outlives its 600 s
# deadline by anything near this).
MAX_REPORTED_S = 3600.0
# A cost model's per-batch and per-step costs, and its per-token cost, at most.
_MAX_COST_S = {"intercept": MAX_REPORTED_S, "per_token": 1.0, "per_step": MAX_REPORTED_S}
# A shed reason is a gateway's metric label ("quota_exceeded"): short by construction.
MAX_REASON_CHARS = 64
# Items of one gateway's status kept at most: breakers (one per replica it routes to), shed
# reasons, tenants (a gateway names 256 and sums the rest as "(other)").
MAX_BREAKERS = 4096
MAX_SHED_REASONS = 64
MAX_TENANTS = 257
_BREAKER_STATES = frozenset(
    {
        control_pb2.BREAKER_STATE_CLOSED,
        control_pb2.BREAKER_STATE_OPEN,
        control_pb2.BREAKER_STATE_HALF_OPEN,
    }
)


class OutcomeTap(Protocol):
    """Sees every accepted outcome as it is ingested (the rollouts' evidence)."""

    def record(self, model: str, version: str, kind: int, latency_s: float) -> None: ...

    def record_batch(self, model: str, version: str, size: int, ok: bool) -> None: ...


@dataclass
class _Cell:
    """Counts for one (model, version) in one time slot."""

    ok: int = 0
    error: int = 0
    shed: int = 0
    late: int = 0
    batches: int = 0
    failed_batches: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def add(self, other: _Cell) -> None:
        self.ok += other.ok
        self.error += other.error
        self.shed += other.shed
        self.late += other.late
        self.batches += other.batches
        self.failed_batches += other.failed_batches
        self.latency.merge(other.latency)


@dataclass(frozen=True)
class VersionOutcomes:
    """One (model, version) over the current window."""

    model: str
    version: str
    ok: int
    error: int
    shed: int
    late: int
    batches: int
    failed_batches: int
    latency: LatencyHistogram  # answered requests only; a private copy

    @property
    def requests(self) -> int:
        return self.ok + self.error + self.shed + self.late

    @property
    def error_rate(self) -> float:
        """(errors + shed) / requests; 0.0 with no requests."""
        return (self.error + self.shed) / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class GatewayReport:
    """The latest status a gateway reported. ``last_report_at`` is an injected-clock reading."""

    gateway_id: str
    last_report_at: float
    concurrency_limit: int
    inflight: int
    cost_models: tuple[fleet_pb2.CostModel, ...]
    reports: int
    breakers: tuple[control_pb2.ReplicaBreaker, ...] = ()
    # Cumulative since that gateway started (see ShedCount and TenantTraffic).
    sheds: tuple[control_pb2.ShedCount, ...] = ()
    tenants: tuple[control_pb2.TenantTraffic, ...] = ()


@dataclass
class IngestResult:
    """What one report contributed: counted requests by kind, dropped items by reason.

    ``problem`` describes the first dropped item (field path and why), for the log line.
    """

    counted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KIND_NAMES.values(), 0))
    dropped: dict[str, int] = field(default_factory=dict)
    problem: str | None = None

    def drop(self, reason: str, path: str, description: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        if self.problem is None:
            self.problem = f"{path}: {description}"

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


def _check_names(
    outcome: control_pb2.RequestOutcome | control_pb2.BatchOutcome,
) -> tuple[str, str, str] | None:
    if not outcome.model:
        return "missing_model", "model", "must not be empty"
    if not outcome.version:
        return "missing_version", "version", "must not be empty"
    for name, limit in (
        ("model", MAX_NAME_CHARS),
        ("version", MAX_NAME_CHARS),
        ("replica_id", MAX_ID_CHARS),
    ):
        problem = identifier_problem(getattr(outcome, name), limit, required=False)
        if problem is not None:
            return "invalid_identifier", name, problem
    return None


def check_request(outcome: control_pb2.RequestOutcome) -> tuple[str, str, str] | None:
    """Why a request outcome cannot be counted — (reason, field, description) — or None."""
    problem = _check_names(outcome)
    if problem is not None:
        return problem
    if outcome.kind not in KIND_NAMES:
        return "invalid_kind", "kind", f"must be OK, ERROR, SHED or LATE, got {outcome.kind}"
    try:
        checked_seconds(outcome.latency, "latency", maximum_s=MAX_REPORTED_S)
    except DurationOutOfRange as exc:
        return "invalid_latency", exc.field, exc.description
    return None


def check_batch(batch: control_pb2.BatchOutcome) -> tuple[str, str, str] | None:
    """Why a batch outcome cannot be counted — (reason, field, description) — or None."""
    problem = _check_names(batch)
    if problem is not None:
        return problem
    try:
        checked_seconds(batch.device_time, "device_time", maximum_s=MAX_REPORTED_S)
    except DurationOutOfRange as exc:
        return "invalid_device_time", exc.field, exc.description
    return None


def check_cost_model(cost: fleet_pb2.CostModel) -> tuple[str, str] | None:
    """Why a reported cost model cannot be kept — (field, description) — or None."""
    problem = identifier_problem(cost.replica_id, MAX_ID_CHARS, required=False)
    if problem is not None:
        return "replica_id", problem
    for name, limit in _MAX_COST_S.items():
        try:
            checked_seconds(getattr(cost, name), name, maximum_s=limit)
        except DurationOutOfRange as exc:
            return exc.field, exc.description
    return None


def check_breaker(breaker: control_pb2.ReplicaBreaker) -> tuple[str, str] | None:
    """Why a reported breaker cannot be kept — (field, description) — or None."""
    problem = identifier_problem(breaker.replica_id, MAX_ID_CHARS)
    if problem is not None:
        return "replica_id", problem
    if breaker.state not in _BREAKER_STATES:
        return "state", f"must be CLOSED, OPEN or HALF_OPEN, got {breaker.state}"
    return None


def check_shed_count(shed: control_pb2.ShedCount) -> tuple[str, str] | None:
    """Why a reported shed count cannot be kept — (field, description) — or None."""
    problem = identifier_problem(shed.reason, MAX_REASON_CHARS)
    return None if problem is None else ("reason", problem)


def check_tenant(tenant: control_pb2.TenantTraffic) -> tuple[str, str] | None:
    """Why a reported tenant's traffic cannot be kept — (field, description) — or None."""
    problem = identifier_problem(tenant.tenant, MAX_NAME_CHARS)
    return None if problem is None else ("tenant", problem)


_Item = TypeVar(
    "_Item", control_pb2.ReplicaBreaker, control_pb2.ShedCount, control_pb2.TenantTraffic
)


def _keep_status_items(
    items: Iterable[_Item],
    *,
    path: str,
    key: str,
    limit: int,
    check: Callable[[_Item], tuple[str, str] | None],
    reason: str,
    result: IngestResult,
) -> list[_Item]:
    """The well-formed, first-of-their-key items of one status list, at most ``limit``
    (copies); every other one dropped and counted under ``reason``."""
    kept: list[_Item] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        problem = check(item)
        if problem is not None:
            name, description = problem
            result.drop(reason, f"{path}[{i}].{name}", description)
            continue
        value: str = getattr(item, key)
        if value in seen:
            result.drop(reason, f"{path}[{i}].{key}", "repeats an earlier item")
            continue
        if len(kept) >= limit:
            result.drop(reason, f"{path}[{i}]", f"more than {limit} items")
            continue
        seen.add(value)
        copy = type(item)()
        copy.CopyFrom(item)
        kept.append(copy)
    return kept


class OutcomeAggregator:
    """Rolling per-(model, version) outcome counts and latencies; latest status per gateway."""

    def __init__(
        self,
        clock: Clock,
        *,
        window_s: float = 60.0,
        slots: int = 6,
        gateway_ttl_s: float = 60.0,
        max_series: int = 1024,
        tap: OutcomeTap | None = None,
    ) -> None:
        if not (math.isfinite(window_s) and window_s > 0.0):
            raise ValueError(f"window_s must be positive and finite, got {window_s}")
        if slots < 1:
            raise ValueError(f"need at least one slot, got {slots}")
        if not gateway_ttl_s > 0.0:
            raise ValueError(f"gateway_ttl_s must be positive, got {gateway_ttl_s}")
        self._clock = clock
        self._window_s = float(window_s)
        self._slots = slots
        self._width = self._window_s / slots
        self._gateway_ttl_s = float(gateway_ttl_s)
        self._max_series = max_series
        self.tap = tap
        # epoch -> (model, version) -> cell; at most `slots` epochs are live.
        self._ring: dict[int, dict[tuple[str, str], _Cell]] = {}
        self._gateways: dict[str, GatewayReport] = {}
        self.reports_total = 0
        # Outcomes not counted (malformed, or beyond max_series), over the aggregator's life.
        self.dropped_outcomes = 0

    @property
    def window_s(self) -> float:
        return self._window_s

    def _epoch(self) -> int:
        return math.floor(self._clock.now() / self._width)

    def _live(self) -> dict[int, dict[tuple[str, str], _Cell]]:
        oldest = self._epoch() - self._slots + 1
        for epoch in [e for e in self._ring if e < oldest]:
            del self._ring[epoch]
        return self._ring

    def _series(self) -> set[tuple[str, str]]:
        return {key for cells in self._live().values() for key in cells}

    # -- ingest -------------------------------------------------------------------------------

    def ingest(self, report: control_pb2.ReportOutcomesRequest) -> IngestResult:
        """Count every well-formed item of one report; drop (and count) the malformed ones."""
        now = self._clock.now()
        live = self._live()
        cells = live.setdefault(self._epoch(), {})
        known = self._series()
        result = IngestResult()
        counted = result.counted
        tap = self.tap

        def cell(model: str, version: str) -> _Cell | None:
            key = (model, version)
            found = cells.get(key)
            if found is not None:
                return found
            if key not in known and len(known) >= self._max_series:
                return None
            known.add(key)
            return cells.setdefault(key, _Cell())

        for i, outcome in enumerate(report.requests):
            problem = check_request(outcome)
            if problem is not None:
                reason, name, description = problem
                result.drop(reason, f"requests[{i}].{name}", description)
                continue
            latency = checked_seconds(outcome.latency, "latency", maximum_s=MAX_REPORTED_S)
            if tap is not None:
                # Rollout evidence is not subject to the series cap: it only keeps the arms
                # of running rollouts.
                tap.record(outcome.model, outcome.version, outcome.kind, latency)
            target = cell(outcome.model, outcome.version)
            if target is None:
                result.drop("series_limit", f"requests[{i}]", "too many (model, version) series")
                continue
            kind = KIND_NAMES[outcome.kind]
            setattr(target, kind, getattr(target, kind) + 1)
            counted[kind] += 1
            if outcome.kind in ANSWERED_KINDS:
                target.latency.record(latency)
        for i, batch in enumerate(report.batches):
            problem = check_batch(batch)
            if problem is not None:
                reason, name, description = problem
                result.drop(reason, f"batches[{i}].{name}", description)
                continue
            if tap is not None:
                tap.record_batch(batch.model, batch.version, batch.size, batch.ok)
            target = cell(batch.model, batch.version)
            if target is None:
                result.drop("series_limit", f"batches[{i}]", "too many (model, version) series")
                continue
            target.batches += 1
            if not batch.ok:
                target.failed_batches += 1
        self.dropped_outcomes += result.dropped_total

        gateway_problem = identifier_problem(report.gateway_id, MAX_ID_CHARS, required=False)
        if gateway_problem is not None:
            result.drop("invalid_identifier", "gateway_id", gateway_problem)
        elif report.gateway_id.strip():
            costs = []
            for i, cost in enumerate(report.cost_models):
                cost_problem = check_cost_model(cost)
                if cost_problem is not None:
                    name, description = cost_problem
                    result.drop("invalid_cost_model", f"cost_models[{i}].{name}", description)
                    continue
                costs.append(_copy_cost(cost))
            breakers = _keep_status_items(
                report.breakers, path="breakers", key="replica_id", limit=MAX_BREAKERS,
                check=check_breaker, reason="invalid_breaker", result=result,
            )  # fmt: skip
            sheds = _keep_status_items(
                report.sheds, path="sheds", key="reason", limit=MAX_SHED_REASONS,
                check=check_shed_count, reason="invalid_shed_count", result=result,
            )  # fmt: skip
            tenants = _keep_status_items(
                report.tenants, path="tenants", key="tenant", limit=MAX_TENANTS,
                check=check_tenant, reason="invalid_tenant", result=result,
            )  # fmt: skip
            previous = self._gateways.get(report.gateway_id)
            self._gateways[report.gateway_id] = GatewayReport(
                gateway_id=report.gateway_id,
                last_report_at=now,
                concurrency_limit=report.concurrency_limit,
                inflight=report.inflight,
                cost_models=tuple(costs),
                reports=(previous.reports if previous else 0) + 1,
                breakers=tuple(breakers),
                sheds=tuple(sheds),
                tenants=tuple(tenants),
            )
        self.reports_total += 1
        return result

    # -- reading ------------------------------------------------------------------------------

    def window(self, model: str, version: str) -> VersionOutcomes:
        """Outcomes of ``(model, version)`` over the live window (zeros if none)."""
        total = _Cell()
        for cells in self._live().values():
            found = cells.get((model, version))
            if found is not None:
                total.add(found)
        return VersionOutcomes(
            model=model,
            version=version,
            ok=total.ok,
            error=total.error,
            shed=total.shed,
            late=total.late,
            batches=total.batches,
            failed_batches=total.failed_batches,
            latency=total.latency,
        )

    def windows(self) -> list[VersionOutcomes]:
        """Every (model, version) with outcomes in the live window, in name order."""
        return [self.window(m, v) for m, v in sorted(self._series())]

    def reset(self, model: str | None = None) -> None:
        """Forget the window of ``model`` (all models if None): a rollout starts afresh."""
        for cells in self._ring.values():
            for key in [k for k in cells if model is None or k[0] == model]:
                del cells[key]

    def gateways(self) -> list[GatewayReport]:
        """Gateways that reported within ``gateway_ttl_s``, by id; older ones are forgotten."""
        horizon = self._clock.now() - self._gateway_ttl_s
        for gateway_id in [g for g, r in self._gateways.items() if r.last_report_at < horizon]:
            del self._gateways[gateway_id]
        return [self._gateways[g] for g in sorted(self._gateways)]


def _copy_cost(cost: fleet_pb2.CostModel) -> fleet_pb2.CostModel:
    out = fleet_pb2.CostModel()
    out.CopyFrom(cost)
    return out
