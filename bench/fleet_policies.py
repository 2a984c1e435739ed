"""Routing strategies the fleet simulation compares, behind one small interface.

What it decides: for each queued request, which replica gets it (or how long to wait), and
whether a slow attempt gets a hedge.

* :class:`RoundRobin` — the next replica in rotation that has a free slot.
* :class:`LeastOutstanding` — the replica with the fewest requests in flight (free slot
  required; ties broken by rotation).
* :class:`HalcyonStrategy` — the production policy objects, unchanged:
  :class:`~gateway.routing.PeakEwmaRouter` (P2C over peak-EWMA cost with circuit breakers)
  and :class:`~gateway.routing.HedgePolicy`.

All three respect each replica's slot ceiling (a worker with no free slot answers "busy", and
none of them is charged for learning that the hard way). The baselines have no health
checks: that is the point of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from common.clock import Clock
from common.rng import Rng
from gateway.routing import (
    HedgeConfig,
    HedgeDeclined,
    HedgePolicy,
    Lease,
    NoCapacity,
    NoHedge,
    Outcome,
    PeakEwmaRouter,
    ReplicaSpec,
    RouterConfig,
)

__all__ = [
    "Attempt",
    "HalcyonStrategy",
    "LeastOutstanding",
    "RoundRobin",
    "Strategy",
]


@dataclass(eq=False)
class Attempt:
    """One dispatch of one request to one replica."""

    replica_id: str
    started: float
    hedge: bool = False
    lease: Lease | None = field(default=None, repr=False)


class Strategy(Protocol):
    name: str

    def pick(self, now: float, exclude: Collection[str]) -> Attempt | float:
        """An attempt, or seconds until asking again could succeed (``inf``: wait for an event)."""
        ...

    def complete(
        self, attempt: Attempt, outcome: Outcome, latency_s: float, now: float
    ) -> None: ...

    def hedge_delay(self, now: float) -> float | None: ...

    def try_hedge(
        self, now: float, primary: Attempt, deadline: float, waiting: int
    ) -> Attempt | float | None:
        """A hedge attempt, seconds until asking again makes sense, or None (never)."""
        ...


class _SlotTable:
    """Inflight counts against slot ceilings, for the baselines."""

    def __init__(self, specs: Sequence[ReplicaSpec]) -> None:
        self.ids = [s.replica_id for s in specs]
        self.slots = {s.replica_id: s.slots for s in specs}
        self.inflight = dict.fromkeys(self.ids, 0)

    def free(self, rid: str, exclude: Collection[str]) -> bool:
        return rid not in exclude and self.inflight[rid] < self.slots[rid]

    def take(self, rid: str, now: float) -> Attempt:
        self.inflight[rid] += 1
        return Attempt(rid, now)

    def release(self, attempt: Attempt) -> None:
        self.inflight[attempt.replica_id] -= 1


class _Baseline:
    """What the baselines share: slot accounting, no outcome learning, no hedging."""

    def __init__(self, specs: Sequence[ReplicaSpec]) -> None:
        self._table = _SlotTable(specs)
        self._cursor = 0

    def complete(self, attempt: Attempt, outcome: Outcome, latency_s: float, now: float) -> None:
        self._table.release(attempt)

    def hedge_delay(self, now: float) -> float | None:
        return None

    def try_hedge(
        self, now: float, primary: Attempt, deadline: float, waiting: int
    ) -> Attempt | None:
        return None


class RoundRobin(_Baseline):
    name = "round-robin"

    def pick(self, now: float, exclude: Collection[str]) -> Attempt | float:
        ids = self._table.ids
        for k in range(len(ids)):
            i = (self._cursor + k) % len(ids)
            if self._table.free(ids[i], exclude):
                self._cursor = i + 1
                return self._table.take(ids[i], now)
        return math.inf


class LeastOutstanding(_Baseline):
    name = "least-outstanding"

    def pick(self, now: float, exclude: Collection[str]) -> Attempt | float:
        ids = self._table.ids
        best: str | None = None
        for k in range(len(ids)):
            rid = ids[(self._cursor + k) % len(ids)]
            if self._table.free(rid, exclude) and (
                best is None or self._table.inflight[rid] < self._table.inflight[best]
            ):
                best = rid
        if best is None:
            return math.inf
        self._cursor += 1
        return self._table.take(best, now)


class HalcyonStrategy:
    """P2C peak-EWMA + breakers (:class:`PeakEwmaRouter`) + hedging (:class:`HedgePolicy`)."""

    name = "halcyon"

    def __init__(
        self,
        specs: Sequence[ReplicaSpec],
        clock: Clock,
        rng: Rng,
        router_config: RouterConfig | None = None,
        hedge_config: HedgeConfig | None = None,
        *,
        hedging: bool = True,
    ) -> None:
        self.router = PeakEwmaRouter(rng, router_config)
        for spec in specs:
            self.router.upsert(spec, clock.now())
        self.hedging = HedgePolicy(clock, hedge_config)
        self._hedge_enabled = hedging
        if not hedging:
            self.name = "halcyon (no hedging)"

    def pick(self, now: float, exclude: Collection[str]) -> Attempt | float:
        lease = self.router.pick(now, exclude)
        if isinstance(lease, NoCapacity):
            return lease.retry_after_s
        self.hedging.record_dispatch()
        return Attempt(lease.replica_id, now, lease=lease)

    def complete(self, attempt: Attempt, outcome: Outcome, latency_s: float, now: float) -> None:
        assert attempt.lease is not None
        self.router.complete(attempt.lease, outcome, latency_s, now)
        if outcome is Outcome.SUCCESS:
            self.hedging.record_latency(latency_s)

    def hedge_delay(self, now: float) -> float | None:
        return self.hedging.hedge_delay(now) if self._hedge_enabled else None

    def try_hedge(
        self, now: float, primary: Attempt, deadline: float, waiting: int
    ) -> Attempt | float | None:
        if not self._hedge_enabled or primary.lease is None:
            return None
        lease = self.hedging.may_hedge(now, self.router, primary.lease, deadline, waiting=waiting)
        if isinstance(lease, NoHedge):
            # The p95 moved since the check was armed: look again when it has passed.
            return lease.wait_s if lease.reason is HedgeDeclined.TOO_EARLY else None
        return Attempt(lease.replica_id, now, hedge=True, lease=lease)
