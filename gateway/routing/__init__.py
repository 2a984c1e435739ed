"""Routing policy: which replica runs a batch, when a replica is shunned, when to hedge.

Pure policy (no gRPC, no asyncio, no wall clock): times are explicit ``now`` arguments, the
only randomness is an injected :class:`~common.rng.Rng`. The same objects run in the gateway
servicer and in ``bench/fleet.py``.

* :class:`PeakEwmaRouter` — power-of-two-choices over eligible replicas scored by peak-EWMA
  cost ``(inflight + 1) x latency / weight``; membership changes at runtime (it reads each
  member's record, a :class:`RouterMember`, by reference).
* :class:`CircuitBreaker` — per replica, judged on outcomes, exponential re-open backoff,
  half-open probes taken only by the replica actually chosen.
* :class:`Outcome` — SUCCESS / FAULT / TIMEOUT / BUSY / CANCELLED and what each may touch.
* :class:`AttemptPolicy` — how long one attempt may take before it is a TIMEOUT, and when a
  request still waiting on a replica is answered anyway (before its deadline);
  :class:`CostFloor` — the lower bounds on a replica's cost that calls out of time proved.
* :class:`HedgePolicy`, :class:`HedgeRace` — p95-triggered hedging within a budget, and the
  "first success wins" race.

Example: one dispatch with a hedge, as the gateway's dispatcher runs it::

    from common.clock import MonotonicClock
    from common.rng import SeededRng
    from gateway.routing import (HedgePolicy, HedgeRace, Lease, NoCapacity, Outcome,
                                 PeakEwmaRouter, ReplicaSpec)

    clock = MonotonicClock()
    router = PeakEwmaRouter(SeededRng(1))
    hedging = HedgePolicy(clock)
    for worker in fleet_update.workers:               # pushed by the controller
        router.upsert(ReplicaSpec(worker.id, slots=worker.slots,
                                  prior_latency_s=nominal_s / worker.speed), clock.now())

    lease = router.pick(clock.now())
    if isinstance(lease, NoCapacity):                 # reason + computed retry-after
        raise no_capacity(lease.reason, lease.retry_after_s)
    hedging.record_dispatch()
    race = HedgeRace(lease)
    # ... after hedging.hedge_delay(now) seconds with no answer:
    hedge = hedging.may_hedge(clock.now(), router, lease, batch.earliest_deadline)
    if isinstance(hedge, Lease):
        race.add_hedge(hedge)
    # ... as each attempt ends:
    result = race.settle(attempt, ok)
    router.complete(attempt, Outcome.SUCCESS if ok else Outcome.FAULT, latency_s, clock.now())
    for loser in result.cancel:
        cancel_rpc(loser)
        router.complete(loser, Outcome.CANCELLED, None, clock.now())
    if ok:
        hedging.record_latency(latency_s)
"""

from gateway.routing.attempt import AttemptConfig, AttemptPolicy, CostFloor
from gateway.routing.breaker import BreakerConfig, BreakerState, CircuitBreaker, Probe
from gateway.routing.hedge import (
    HedgeBudget,
    HedgeConfig,
    HedgeDeclined,
    HedgePolicy,
    HedgeRace,
    NoHedge,
    RaceResult,
    RaceVerdict,
)
from gateway.routing.outcome import Outcome
from gateway.routing.router import (
    Lease,
    NoCapacity,
    NoCapacityReason,
    PeakEwmaRouter,
    ReplicaSpec,
    ReplicaView,
    RouterConfig,
    RouterMember,
    peak_ewma_cost,
)

__all__ = [
    "AttemptConfig",
    "AttemptPolicy",
    "BreakerConfig",
    "BreakerState",
    "CircuitBreaker",
    "CostFloor",
    "HedgeBudget",
    "HedgeConfig",
    "HedgeDeclined",
    "HedgePolicy",
    "HedgeRace",
    "Lease",
    "NoCapacity",
    "NoCapacityReason",
    "NoHedge",
    "Outcome",
    "PeakEwmaRouter",
    "Probe",
    "RaceResult",
    "RaceVerdict",
    "ReplicaSpec",
    "ReplicaView",
    "RouterConfig",
    "RouterMember",
    "peak_ewma_cost",
]
