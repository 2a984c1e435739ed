"""Which replica gets the next batch: peak-EWMA cost under power-of-two-choices.

What it decides: for each dispatch, one replica out of the current membership, or a reasoned
refusal (:class:`NoCapacity`) that the servicer turns into ``UNAVAILABLE / NO_CAPACITY`` with a
computed retry-after.

How:

* **Eligibility is a hard filter**, not a score: a replica is eligible when it is not
  draining, its lease (if it has one) is fresh, it has fewer batches in flight than its
  advertised slots, and its :class:`~gateway.routing.breaker.CircuitBreaker` allows a
  dispatch. (Scoring alone let a slow-enough busy replica win the comparison while already
  occupied.)
* **Cost** ``(inflight + 1) x latency_estimate / weight``: the predicted wait for one more
  batch (Little's law per replica). ``latency_estimate`` is a
  :class:`~common.ewma.PeakEwma`: a slower sample replaces it at once, faster ones blend in by
  elapsed time, and with no samples it relaxes toward a prior (the replica's advertised
  latency, or the fleet median when it advertises none), never toward zero.
* **Power of two choices**: two distinct eligible replicas drawn with the injected ``Rng``;
  the cheaper wins (the first drawn on a tie). Many gateways with no shared state do not
  stampede the same "best" replica, which picking the global minimum would.
* **Only the chosen replica is touched**: its inflight count goes up and, if its breaker is
  half-open, it takes a probe slot. The other candidate is left exactly as it was.
* **Exactly-once release**: every :class:`Lease` is released by one :meth:`complete`; a
  second call is a no-op that returns False, so a racing cancel and completion cannot
  double-decrement the inflight count.

The router is not thread-safe: one asyncio event loop owns it (no call awaits inside).

Membership changes at runtime (the controller pushes it): :meth:`upsert` adds a replica or
hands the router its new record, :meth:`remove` forgets one (its outstanding leases then
release as no-ops). The router keeps a reference to each member's record (any
:class:`RouterMember`: a :class:`ReplicaSpec`, or in the gateway the owner's
:class:`~gateway.replicas.ReplicaInfo`) and reads its slots, prior, weight and draining flag
from it; what it stores itself is only what routing learns: latency estimate, breaker, leases.

Example (an asyncio gateway; ``router`` shared by the dispatch loop)::

    router = PeakEwmaRouter(SeededRng(7))
    router.upsert(ReplicaSpec("gpu-a", slots=2, prior_latency_s=0.030), now=clock.now())
    router.upsert(ReplicaSpec("gpu-b", slots=1, prior_latency_s=0.050), now=clock.now())

    tried: set[str] = set()
    while True:
        lease = router.pick(clock.now(), exclude=tried)
        if isinstance(lease, NoCapacity):
            raise_unavailable("NO_CAPACITY", retry_after_s=lease.retry_after_s)
        try:
            reply = await stub(lease.replica_id).ExecuteBatch(batch)
        except Busy:
            router.complete(lease, Outcome.BUSY, None, clock.now())
            tried.add(lease.replica_id)          # backpressure: try elsewhere
            continue
        except asyncio.CancelledError:
            router.complete(lease, Outcome.CANCELLED, None, clock.now())
            raise
        except Exception:
            router.complete(lease, Outcome.FAULT, None, clock.now())
            raise
        router.complete(lease, Outcome.SUCCESS, reply.execution_s, clock.now())
        return reply
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from common.ewma import PeakEwma
from common.rng import Rng
from gateway.routing.breaker import BreakerConfig, BreakerState, CircuitBreaker, Probe
from gateway.routing.outcome import Outcome

__all__ = [
    "Lease",
    "NoCapacity",
    "NoCapacityReason",
    "PeakEwmaRouter",
    "ReplicaSpec",
    "ReplicaView",
    "RouterConfig",
    "RouterMember",
    "peak_ewma_cost",
]

# No attempt lasts longer than the longest deadline a request may have (600 s); an hour bounds
# every latency sample with room to spare.
MAX_LATENCY_SAMPLE_S = 3600.0


def peak_ewma_cost(inflight: int, latency_estimate_s: float, weight: float) -> float:
    """Predicted wait for one more batch: ``(inflight + 1) x latency / weight``."""
    return (inflight + 1) * latency_estimate_s / weight


class RouterMember(Protocol):
    """What the router reads of a member's record (it never writes it)."""

    @property
    def replica_id(self) -> str: ...

    @property
    def slots(self) -> int: ...

    @property
    def prior_latency_s(self) -> float | None: ...

    @property
    def weight(self) -> float: ...

    @property
    def draining(self) -> bool: ...


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica advertises: identity, hard concurrency, expected speed, share weight,
    and whether it drains — a :class:`RouterMember` for a router driven on its own (the
    benchmark, tests); the gateway hands it the membership owner's records instead."""

    replica_id: str
    slots: int = 1
    """Hard ceiling on batches in flight (the worker's advertised slots)."""
    prior_latency_s: float | None = None
    """Expected batch latency when idle (e.g. ``nominal_latency / speed``); None = fleet median."""
    weight: float = 1.0
    """Relative capacity weight; cost is divided by it."""
    draining: bool = False
    """Takes no new work; its inflight work finishes normally."""

    def __post_init__(self) -> None:
        if not self.replica_id:
            raise ValueError("replica_id must be non-empty")
        if self.slots < 0:
            raise ValueError(f"slots must be non-negative, got {self.slots}")
        if self.prior_latency_s is not None and not (
            math.isfinite(self.prior_latency_s) and self.prior_latency_s > 0.0
        ):
            raise ValueError(f"prior_latency_s must be positive, got {self.prior_latency_s}")
        if not (math.isfinite(self.weight) and self.weight > 0.0):
            raise ValueError(f"weight must be positive, got {self.weight}")


@dataclass(frozen=True)
class RouterConfig:
    ewma_tau_s: float = 2.0
    """Memory of the peak EWMA: how fast a latency peak is forgotten."""
    default_prior_latency_s: float = 0.05
    """Prior for a replica that advertises none while the fleet has no estimate either."""
    prior_refresh_s: float = 1.0
    """How often the fleet-median prior is recomputed (it is a slow-moving figure)."""
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    no_replica_retry_s: float = 1.0
    """Retry advice when no replica is routable at all (membership must change first)."""
    min_retry_s: float = 0.001
    """Floor of any computed retry-after (below a timer tick nothing is gained)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ewma_tau_s) and self.ewma_tau_s > 0.0):
            raise ValueError("ewma_tau_s must be positive")
        if not self.default_prior_latency_s > 0.0:
            raise ValueError("default_prior_latency_s must be positive")
        if self.no_replica_retry_s <= 0.0 or self.min_retry_s <= 0.0:
            raise ValueError("retry figures must be positive")


class NoCapacityReason(StrEnum):
    NO_REPLICA = "no_replica"
    """Nothing routable: no members, or all excluded, draining or with expired leases."""
    ALL_BUSY = "all_busy"
    """Every routable replica is at its slot ceiling (some may also have open breakers)."""
    ALL_BREAKERS_OPEN = "all_breakers_open"
    """Every routable replica's breaker refuses (open, or half-open with no probe slot)."""


@dataclass(frozen=True)
class NoCapacity:
    """Why :meth:`PeakEwmaRouter.pick` found no replica, and when trying again makes sense."""

    reason: NoCapacityReason
    retry_after_s: float
    error_reason: str = "NO_CAPACITY"
    """The ``ErrorInfo.reason`` the servicer should send (``common.errors.Reason`` value)."""


@dataclass(frozen=True)
class ReplicaView:
    """A read-only snapshot of one replica's routing state (for metrics and debugging)."""

    replica_id: str
    slots: int
    inflight: int
    weight: float
    latency_estimate_s: float
    cost: float
    breaker: BreakerState
    draining: bool
    lease_fresh: bool
    eligible: bool


class _Replica:
    __slots__ = (
        "breaker",
        "ewma",
        "inflight",
        "lease_until",
        "spec",
        "started",
    )

    def __init__(self, spec: RouterMember, prior: float, config: RouterConfig) -> None:
        self.spec = spec  # the member's record, by reference: read, never copied
        self.ewma = PeakEwma(config.ewma_tau_s, prior)
        self.breaker = CircuitBreaker(config.breaker)
        self.inflight = 0
        self.lease_until: float | None = None
        self.started: dict[int, float] = {}  # lease id -> dispatch time, for drain prediction

    def lease_fresh(self, now: float) -> bool:
        return self.lease_until is None or now < self.lease_until

    def routable(self, now: float) -> bool:
        """Member in good standing: not draining, lease fresh (capacity and breaker aside)."""
        return not self.spec.draining and self.lease_fresh(now)

    def has_slot(self) -> bool:
        return self.inflight < self.spec.slots

    def cost(self, now: float) -> float:
        return peak_ewma_cost(self.inflight, self.ewma.estimate(now), self.spec.weight)


@dataclass(eq=False)
class Lease:
    """One dispatch to one replica; release it exactly once with :meth:`PeakEwmaRouter.complete`."""

    lease_id: int
    replica_id: str
    dispatched_at: float
    hedge: bool
    probe: bool
    """Whether this dispatch holds a half-open probe slot."""
    _replica: _Replica = field(repr=False)
    _probe: Probe | None = field(repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def released(self) -> bool:
        return self._released


class PeakEwmaRouter:
    """P2C over peak-EWMA cost with per-replica breakers. See the module docstring."""

    def __init__(self, rng: Rng, config: RouterConfig | None = None) -> None:
        self._rng = rng
        self._config = config or RouterConfig()
        self._replicas: dict[str, _Replica] = {}
        self._lease_ids = itertools.count(1)
        self._priors_refreshed_at: float | None = None

    @property
    def config(self) -> RouterConfig:
        return self._config

    # -- membership ---------------------------------------------------------------------------

    def upsert(self, spec: RouterMember, now: float, *, lease_until: float | None = None) -> None:
        """Add a replica, or take an existing one's new record (slots, prior, weight,
        draining: a draining replica gets no new work, its inflight work finishes normally).

        Updating keeps the replica's inflight count, latency estimate and breaker: a
        membership refresh is not a fresh start. ``lease_until`` (absolute time) makes the
        replica ineligible once passed; None means the membership source expires it.
        """
        existing = self._replicas.get(spec.replica_id)
        if existing is None:
            prior = (
                spec.prior_latency_s
                if spec.prior_latency_s is not None
                else self._fleet_median(now)
            )
            replica = _Replica(spec, prior, self._config)
            self._replicas[spec.replica_id] = replica
        else:
            existing.spec = spec
            replica = existing
            if spec.prior_latency_s is not None:
                replica.ewma.set_prior(spec.prior_latency_s)
        replica.lease_until = lease_until
        self._refresh_priors(now, force=True)

    def renew_lease(self, replica_id: str, lease_until: float | None) -> bool:
        replica = self._replicas.get(replica_id)
        if replica is None:
            return False
        replica.lease_until = lease_until
        return True

    def remove(self, replica_id: str) -> bool:
        """Forget a replica. Its outstanding leases still release (as no-ops)."""
        return self._replicas.pop(replica_id, None) is not None

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._replicas

    def __len__(self) -> int:
        return len(self._replicas)

    def replica_ids(self) -> list[str]:
        return list(self._replicas)

    def member(self, replica_id: str) -> RouterMember | None:
        """The record the router holds for a member (the one it was last handed)."""
        replica = self._replicas.get(replica_id)
        return None if replica is None else replica.spec

    # -- priors -------------------------------------------------------------------------------

    def _fleet_median(self, now: float) -> float:
        """Median latency estimate of replicas that know their speed (advertised or sampled)."""
        known = [
            r.ewma.estimate(now)
            for r in self._replicas.values()
            if r.spec.prior_latency_s is not None or r.ewma.last_sample_at is not None
        ]
        return statistics.median(known) if known else self._config.default_prior_latency_s

    def _refresh_priors(self, now: float, *, force: bool = False) -> None:
        last = self._priors_refreshed_at
        if not force and last is not None and now - last < self._config.prior_refresh_s:
            return
        self._priors_refreshed_at = now
        if all(r.spec.prior_latency_s is not None for r in self._replicas.values()):
            return
        median = self._fleet_median(now)
        for r in self._replicas.values():
            if r.spec.prior_latency_s is None:
                r.ewma.set_prior(median)

    # -- dispatch -----------------------------------------------------------------------------

    def _eligible(self, r: _Replica, now: float, hedge: bool) -> bool:
        if not (r.routable(now) and r.has_slot()):
            return False
        if hedge:
            # A hedge buys latency with spare capacity; it goes to replicas known to be good,
            # never as a half-open probe.
            return r.breaker.state(now) is BreakerState.CLOSED
        return r.breaker.allows(now)

    def pick(
        self, now: float, exclude: Collection[str] = (), *, hedge: bool = False
    ) -> Lease | NoCapacity:
        """Choose a replica for one batch and take a lease on it, or say why none can take it.

        ``exclude`` lists replicas already tried for this batch (busy, or the hedge primary).
        ``hedge=True`` additionally skips half-open replicas and marks the lease as a hedge.
        """
        self._refresh_priors(now)
        eligible = [
            r
            for rid, r in self._replicas.items()
            if rid not in exclude and self._eligible(r, now, hedge)
        ]
        n = len(eligible)
        if n == 0:
            return self._no_capacity(now, exclude)
        if n == 1:
            chosen = eligible[0]
        else:
            i = self._rng.randrange(n)
            j = self._rng.randrange(n - 1)
            if j >= i:
                j += 1
            a, b = eligible[i], eligible[j]
            chosen = b if b.cost(now) < a.cost(now) else a
        return self._dispatch(chosen, now, hedge)

    def _dispatch(self, replica: _Replica, now: float, hedge: bool) -> Lease:
        probe = replica.breaker.on_dispatch(now)
        replica.inflight += 1
        lease_id = next(self._lease_ids)
        replica.started[lease_id] = now
        return Lease(
            lease_id=lease_id,
            replica_id=replica.spec.replica_id,
            dispatched_at=now,
            hedge=hedge,
            probe=probe is not None,
            _replica=replica,
            _probe=probe,
        )

    def _no_capacity(self, now: float, exclude: Collection[str]) -> NoCapacity:
        cfg = self._config
        routable = [
            r for rid, r in self._replicas.items() if rid not in exclude and r.routable(now)
        ]
        if not routable:
            return NoCapacity(NoCapacityReason.NO_REPLICA, cfg.no_replica_retry_s)
        # Each routable replica lacks a slot, or its breaker refuses, or both; it becomes
        # usable once every obstacle has cleared. The earliest such moment is the advice.
        waits: list[float] = []
        for r in routable:
            wait = 0.0 if r.has_slot() else self._predicted_slot_free(r, now)
            if not r.breaker.allows(now):
                reopen = r.breaker.reopen_at(now)
                # OPEN: until the backoff ends; HALF_OPEN with its probes out: until one lands.
                breaker_wait = (
                    reopen - now if reopen is not None else self._predicted_slot_free(r, now)
                )
                wait = max(wait, breaker_wait)
            waits.append(wait)
        retry = max(cfg.min_retry_s, min(waits))
        if any(r.breaker.allows(now) for r in routable):
            return NoCapacity(NoCapacityReason.ALL_BUSY, retry)
        return NoCapacity(NoCapacityReason.ALL_BREAKERS_OPEN, retry)

    def _predicted_slot_free(self, r: _Replica, now: float) -> float:
        """Seconds until the oldest batch on ``r`` is predicted to finish (>= the floor)."""
        estimate = r.ewma.estimate(now)
        if not r.started:
            return estimate
        oldest = min(r.started.values())
        return max(self._config.min_retry_s, oldest + estimate - now)

    def complete(self, lease: Lease, outcome: Outcome, latency_s: float | None, now: float) -> bool:
        """Release ``lease`` with its outcome. Returns False (and does nothing) if already released.

        ``latency_s`` is the batch's observed latency for SUCCESS, or how long a TIMEOUT waited
        (default: ``now`` minus the dispatch time); every other outcome leaves the estimate
        alone.
        """
        if lease._released:
            return False
        lease._released = True
        replica = lease._replica
        if self._replicas.get(lease.replica_id) is not replica:
            return True  # removed (or replaced) since dispatch: nothing left to account
        replica.inflight -= 1
        replica.started.pop(lease.lease_id, None)
        if outcome is Outcome.SUCCESS or outcome is Outcome.TIMEOUT:
            sample = now - lease.dispatched_at if latency_s is None else latency_s
            # Only a real duration is evidence: NaN, infinities and negative values (a buggy
            # caller, a clock read on another timeline) never reach the estimate, and a huge one
            # is capped so that sums and medians over replicas cannot overflow.
            if sample >= 0.0 and math.isfinite(sample):
                replica.ewma.observe(min(sample, MAX_LATENCY_SAMPLE_S), now)
            if outcome is Outcome.SUCCESS:
                replica.breaker.on_success(now, lease._probe)
            else:
                replica.breaker.on_timeout(now, lease._probe)
        elif outcome is Outcome.FAULT:
            replica.breaker.on_failure(now, lease._probe)
        else:
            replica.breaker.on_release(now, lease._probe)
        return True

    # -- reading ------------------------------------------------------------------------------

    def latency_estimate(self, replica_id: str, now: float) -> float | None:
        replica = self._replicas.get(replica_id)
        return None if replica is None else replica.ewma.estimate(now)

    def spare_replicas(self, now: float, exclude: Collection[str] = ()) -> int:
        """How many replicas outside ``exclude`` could take a hedge now (closed breaker, slot)."""
        return sum(
            1
            for rid, r in self._replicas.items()
            if rid not in exclude and self._eligible(r, now, hedge=True)
        )

    def utilization(self, now: float) -> float:
        """Share of slots in use over replicas that can take work (routable, breaker not open).

        1.0 when there is no such slot at all: an empty fleet is as saturated as it gets.
        """
        slots = inflight = 0
        for r in self._replicas.values():
            if r.routable(now) and r.breaker.state(now) is not BreakerState.OPEN:
                slots += r.spec.slots
                inflight += min(r.inflight, r.spec.slots)
        return inflight / slots if slots else 1.0

    def views(self, now: float) -> Iterator[ReplicaView]:
        for rid, r in self._replicas.items():
            yield ReplicaView(
                replica_id=rid,
                slots=r.spec.slots,
                inflight=r.inflight,
                weight=r.spec.weight,
                latency_estimate_s=r.ewma.estimate(now),
                cost=r.cost(now),
                breaker=r.breaker.state(now),
                draining=r.spec.draining,
                lease_fresh=r.lease_fresh(now),
                eligible=self._eligible(r, now, hedge=False),
            )
