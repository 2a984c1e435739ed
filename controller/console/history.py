"""A few minutes of traffic, per second, in a fixed-size ring: what the console's charts draw.

What it decides: what the console remembers of the traffic the controller sees, and how much.
The controller keeps only a rolling window (:mod:`controller.outcomes`) and the latest status
of each gateway: enough for GetState, not for a chart of the last five minutes. This keeps one
slot per ``slot_s`` for ``horizon_s`` (default 300 one-second slots), in a ring indexed by
``epoch % slots``, so its memory is fixed whatever the traffic:

* request outcomes (ok, error, shed, late) per model and per (model, version), as gateway
  reports deliver them (fed through the aggregator's tap, see :mod:`controller.console.tap`),
  with a latency sketch per model while its slot is current; when the slot is past, the
  sketch is read once (p50, p95, p99) and dropped (*sealed*), so a past slot holds numbers only;
* gauges sampled once per tick by the console (:meth:`TrafficHistory.sample`): each
  gateway's adaptive concurrency limit and in-flight requests, and each model's busy and total
  slots from worker heartbeats;
* sheds by reason and traffic per tenant, summed over the gateways: they report these as
  counts *cumulative* since each gateway started, so each tick puts their increase since the
  previous tick in the current slot (:class:`controller.console.counters.CumulativeDeltas`:
  a gateway's first report is a baseline, and a gateway whose counts went down restarted —
  its new counts are the increase). A slot's count per ``slot_s`` is the rate.

Bounds: at most ``max_series`` models, (model, version) pairs, gateways and shed reasons per
slot; what exceeds them is counted in :attr:`TrafficHistory.dropped` rather than stored. At
most ``max_tenants`` tenants per slot, the rest summed as ``"(other)"`` (a tenant's rate is
worth keeping in a sum; a shed reason is a fixed label and never near the bound). An outcome is
counted in the slot of the moment its report arrives (reports come about once a second), so
"offered" and "goodput" are per-second rates at one-second slots.

Goodput is requests answered in time (kind OK); offered is every outcome of any kind (OK,
ERROR, SHED, LATE). Pure: an injected clock, no I/O; readings carry the clock's time and the
caller maps them to wall time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.clock import Clock
from common.histogram import LatencyHistogram
from controller.console.counters import CumulativeDeltas
from controller.outcomes import ANSWERED_KINDS, KIND_NAMES

__all__ = [
    "KINDS",
    "OTHER_TENANTS",
    "TENANT_FIELDS",
    "GatewayCounters",
    "GatewayGauge",
    "LoadGauge",
    "TrafficHistory",
]

# Outcome kind -> the name charts and JSON use: the controller's own label domain.
KINDS = KIND_NAMES
_QUANTILES = (("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99))
# A tenant's counters, as TenantTraffic names them.
TENANT_FIELDS = ("requests", "admitted", "quota_refused", "shed", "ok", "errors")
OTHER_TENANTS = "(other)"


def _sketch() -> LatencyHistogram:
    # 100 us .. 10 min at 2 %: ~390 buckets while a slot is current, none once it is sealed.
    return LatencyHistogram(lowest=1e-4, highest=600.0, relative_error=0.02)


@dataclass(frozen=True)
class GatewayGauge:
    """One gateway's limiter at a tick."""

    limit: int
    inflight: int


@dataclass(frozen=True)
class GatewayCounters:
    """One gateway's cumulative counts at a tick: shed reason -> count, and tenant ->
    TENANT_FIELDS name -> count (both since that gateway started)."""

    sheds: Mapping[str, int] = field(default_factory=dict)
    tenants: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadGauge:
    """One model's replicas at a tick: slots executing a batch, and slots in all."""

    busy: int
    slots: int


@dataclass
class _Counts:
    ok: int = 0
    error: int = 0
    shed: int = 0
    late: int = 0

    def add(self, kind: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)

    def as_json(self) -> dict[str, int]:
        return {
            "offered": self.ok + self.error + self.shed + self.late,
            "ok": self.ok,
            "error": self.error,
            "shed": self.shed,
            "late": self.late,
        }


@dataclass
class _Slot:
    epoch: int
    models: dict[str, _Counts] = field(default_factory=dict)
    versions: dict[tuple[str, str], _Counts] = field(default_factory=dict)
    sketches: dict[str, LatencyHistogram] | None = field(default_factory=dict)
    quantiles: dict[str, dict[str, float]] = field(default_factory=dict)
    gateways: dict[str, GatewayGauge] = field(default_factory=dict)
    load: dict[str, LoadGauge] = field(default_factory=dict)
    failed_batches: int = 0
    # Increases in the slot (from the gateways' cumulative counts), summed over gateways.
    sheds: dict[str, int] = field(default_factory=dict)
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)

    def seal(self) -> None:
        """Read each model's latency sketch once and drop it: a past slot holds numbers only."""
        if self.sketches is None:
            return
        for model, sketch in self.sketches.items():
            if sketch.count:
                self.quantiles[model] = {
                    name: round(sketch.quantile(q) * 1000.0, 3) for name, q in _QUANTILES
                }
        self.sketches = None


class TrafficHistory:
    """Per-slot outcome counts, latency quantiles and gauges over the last ``horizon_s``."""

    def __init__(
        self,
        clock: Clock,
        *,
        horizon_s: float = 300.0,
        slot_s: float = 1.0,
        max_series: int = 32,
        max_tenants: int = 64,
    ) -> None:
        if not (math.isfinite(slot_s) and slot_s > 0.0):
            raise ValueError(f"slot_s must be positive and finite, got {slot_s}")
        if not (math.isfinite(horizon_s) and horizon_s >= slot_s):
            raise ValueError(f"horizon_s must be finite and at least slot_s, got {horizon_s}")
        if max_series < 1:
            raise ValueError(f"max_series must be at least 1, got {max_series}")
        if max_tenants < 1:
            raise ValueError(f"max_tenants must be at least 1, got {max_tenants}")
        self._clock = clock
        self.slot_s = float(slot_s)
        self.slots = math.ceil(horizon_s / slot_s)
        self.max_series = max_series
        self.max_tenants = max_tenants
        self._shed_deltas: CumulativeDeltas[str] = CumulativeDeltas()
        self._tenant_deltas: CumulativeDeltas[tuple[str, str]] = CumulativeDeltas()
        self._ring: list[_Slot | None] = [None] * self.slots
        # Items not stored because a slot already held max_series of their kind.
        self.dropped = 0

    @property
    def horizon_s(self) -> float:
        return self.slots * self.slot_s

    def _epoch(self, now: float) -> int:
        return math.floor(now / self.slot_s)

    def _current(self) -> _Slot:
        epoch = self._epoch(self._clock.now())
        index = epoch % self.slots
        slot = self._ring[index]
        if slot is None or slot.epoch != epoch:
            slot = _Slot(epoch)
            self._ring[index] = slot
        return slot

    def _bounded(self, table: Mapping[Any, Any], key: Any) -> bool:
        if key in table or len(table) < self.max_series:
            return True
        self.dropped += 1
        return False

    # -- feeding ------------------------------------------------------------------------------

    def record(self, model: str, version: str, kind: int, latency_s: float) -> None:
        """Count one request outcome (validated by the aggregator) in the current slot."""
        name = KINDS.get(kind)
        if name is None:
            return
        slot = self._current()
        if not self._bounded(slot.models, model):
            return
        slot.models.setdefault(model, _Counts()).add(name)
        if self._bounded(slot.versions, (model, version)):
            slot.versions.setdefault((model, version), _Counts()).add(name)
        if kind in ANSWERED_KINDS and slot.sketches is not None and math.isfinite(latency_s):
            slot.sketches.setdefault(model, _sketch()).record(max(latency_s, 0.0))

    def record_batch(self, model: str, version: str, size: int, ok: bool) -> None:
        """Count a failed batch (a fault the gateway's retry may have hidden from clients)."""
        if not ok:
            self._current().failed_batches += 1

    def sample(
        self,
        gateways: Iterable[tuple[str, GatewayGauge]],
        load: Iterable[tuple[str, LoadGauge]],
        counters: Iterable[tuple[str, GatewayCounters]] = (),
    ) -> None:
        """Put this tick's gauges in the current slot (a later sample in the slot wins), and
        the increase of every gateway's cumulative counters since the previous tick (added).

        ``counters`` lists every gateway reporting now (one left out is forgotten: its next
        counts are a baseline again)."""
        slot = self._current()
        counts = dict(counters)
        self._add_sheds(slot, self._shed_deltas.update({g: c.sheds for g, c in counts.items()}))
        self._add_tenants(
            slot,
            self._tenant_deltas.update(
                {
                    g: {
                        (tenant, name): value
                        for tenant, fields in c.tenants.items()
                        for name, value in fields.items()
                        if name in TENANT_FIELDS
                    }
                    for g, c in counts.items()
                }
            ),
        )
        slot.gateways.clear()
        slot.load.clear()
        for gateway_id, limiter in gateways:
            if self._bounded(slot.gateways, gateway_id):
                slot.gateways[gateway_id] = limiter
        for model, busy in load:
            if self._bounded(slot.load, model):
                slot.load[model] = busy

    def _add_sheds(self, slot: _Slot, increases: Mapping[str, int]) -> None:
        for reason, n in sorted(increases.items()):
            if self._bounded(slot.sheds, reason):
                slot.sheds[reason] = slot.sheds.get(reason, 0) + n

    def _add_tenants(self, slot: _Slot, increases: Mapping[tuple[str, str], int]) -> None:
        for (tenant, name), n in sorted(increases.items()):
            if tenant not in slot.tenants and len(slot.tenants) >= self.max_tenants - 1:
                tenant = OTHER_TENANTS  # the last place is the sum of the rest
            row = slot.tenants.setdefault(tenant, dict.fromkeys(TENANT_FIELDS, 0))
            row[name] += n

    # -- reading ------------------------------------------------------------------------------

    def points(self, since: float | None = None) -> list[dict[str, Any]]:
        """Every past (complete) slot within the horizon, oldest first, as JSON-ready dicts;
        with ``since`` (a clock reading), only slots that start at or after it.

        ``t`` is the slot's start on the injected clock; counts are per slot.
        """
        current = self._epoch(self._clock.now())
        oldest = current - self.slots + 1
        found = [
            s
            for s in self._ring
            if s is not None and oldest <= s.epoch < current
            and (since is None or s.epoch * self.slot_s >= since)
        ]  # fmt: skip
        found.sort(key=lambda s: s.epoch)
        out = []
        for slot in found:
            slot.seal()
            out.append(self._point(slot))
        return out

    def _point(self, slot: _Slot) -> dict[str, Any]:
        models = {}
        for model, counts in sorted(slot.models.items()):
            entry: dict[str, Any] = counts.as_json()
            entry.update(slot.quantiles.get(model, {}))
            models[model] = entry
        return {
            "t": slot.epoch * self.slot_s,
            "models": models,
            "versions": {f"{m}/{v}": c.as_json() for (m, v), c in sorted(slot.versions.items())},
            "failed_batches": slot.failed_batches,
            "gateways": {
                g: {"limit": v.limit, "inflight": v.inflight}
                for g, v in sorted(slot.gateways.items())
            },
            "load": {m: {"busy": v.busy, "slots": v.slots} for m, v in sorted(slot.load.items())},
            "sheds": dict(sorted(slot.sheds.items())),
            "tenants": {t: dict(c) for t, c in sorted(slot.tenants.items())},
        }

    def __len__(self) -> int:
        """Slots holding data (current one included)."""
        current = self._epoch(self._clock.now())
        oldest = current - self.slots + 1
        return sum(1 for s in self._ring if s is not None and oldest <= s.epoch <= current)
