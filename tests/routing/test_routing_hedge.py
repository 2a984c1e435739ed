"""Hedging: p95 delay after a minimum sample count, budget, spare-replica and deadline tests,
saturation stand-down, and the "first success wins" race."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from common.rng import SeededRng
from gateway.routing import (
    BreakerConfig,
    HedgeBudget,
    HedgeConfig,
    HedgeDeclined,
    HedgePolicy,
    HedgeRace,
    Lease,
    NoCapacity,
    NoHedge,
    Outcome,
    PeakEwmaRouter,
    RaceVerdict,
    ReplicaSpec,
    RouterConfig,
)

HEDGE = HedgeConfig(min_samples=20, budget_ratio=0.05, budget_burst=2.0, delay_refresh_s=0.0)


def fleet(n: int = 3, slots: int = 1) -> PeakEwmaRouter:
    r = PeakEwmaRouter(
        SeededRng(3), RouterConfig(breaker=BreakerConfig(min_requests=2, half_open_successes=1))
    )
    for i in range(n):
        r.upsert(ReplicaSpec(f"r{i}", slots=slots, prior_latency_s=0.02), 0.0)
    return r


def warmed(clock: ManualClock, dispatches: int = 100) -> HedgePolicy:
    policy = HedgePolicy(clock, HEDGE)
    for i in range(100):
        policy.record_latency(0.010 + 0.0001 * i)  # 10 .. 19.9 ms; p95 ~ 19.5 ms
    for _ in range(dispatches):
        policy.record_dispatch()
    return policy


def primary_on(r: PeakEwmaRouter, now: float, replica: str = "r0") -> Lease:
    others = [x for x in r.replica_ids() if x != replica]
    lease = r.pick(now, exclude=others)
    assert isinstance(lease, Lease)
    return lease


def test_no_hedge_delay_before_the_minimum_sample_count() -> None:
    clock = ManualClock()
    policy = HedgePolicy(clock, HEDGE)
    for _ in range(HEDGE.min_samples - 1):
        policy.record_latency(0.01)
    assert policy.hedge_delay(0.0) is None
    policy.record_latency(0.01)
    assert policy.hedge_delay(0.0) == pytest.approx(0.01, rel=0.02)


def test_hedge_delay_is_the_recent_p95() -> None:
    clock = ManualClock()
    policy = warmed(clock)
    delay = policy.hedge_delay(0.0)
    assert delay == pytest.approx(0.0195, rel=0.02)
    # The window forgets: after it passes with no samples there is no baseline any more.
    clock.set(HEDGE.window_s + 1.0)
    assert policy.hedge_delay(clock.now()) is None


def test_three_replica_fleet_can_hedge() -> None:
    """The batch being hedged is not counted against the spare capacity (defect 6)."""
    clock = ManualClock()
    policy = warmed(clock)
    r = fleet(3)
    primary = primary_on(r, 0.0)
    hedge = policy.may_hedge(0.05, r, primary, earliest_deadline=1.0)
    assert isinstance(hedge, Lease)
    assert hedge.hedge and hedge.replica_id != primary.replica_id


def test_declines_in_order_of_the_rules() -> None:
    clock = ManualClock()
    r = fleet(2)
    cold = HedgePolicy(clock, HEDGE)
    primary = primary_on(r, 0.0)
    assert cold.may_hedge(0.05, r, primary, 1.0) == NoHedge(HedgeDeclined.NO_BASELINE)

    policy = warmed(clock)
    too_early = policy.may_hedge(0.005, r, primary, 1.0)
    assert isinstance(too_early, NoHedge) and too_early.reason is HedgeDeclined.TOO_EARLY
    assert too_early.wait_s == pytest.approx(0.0145, rel=0.05)

    broke = warmed(clock, dispatches=10)  # 0.5 tokens: not enough for a hedge
    assert broke.may_hedge(0.05, r, primary, 1.0) == NoHedge(HedgeDeclined.NO_BUDGET)

    assert policy.may_hedge(0.05, r, primary, 1.0, waiting=1) == NoHedge(HedgeDeclined.SATURATED)
    # Deadline: the spare replica's estimate (20 ms) does not fit in 10 ms.
    assert policy.may_hedge(0.05, r, primary, 0.06) == NoHedge(HedgeDeclined.DEADLINE)
    assert policy.may_hedge(0.05, r, primary, 0.5, predicted_latency_s=0.5) == NoHedge(
        HedgeDeclined.DEADLINE
    )
    assert policy.may_hedge(
        0.05, r, primary, 1.0, predicted_latency_s=lambda rid: {"r1": 2.0}[rid]
    ) == NoHedge(HedgeDeclined.DEADLINE)
    # Declined hedges left nothing behind: the spare replica is still free.
    assert all(v.inflight == 0 for v in r.views(0.05) if v.replica_id == "r1")
    other = policy.may_hedge(0.05, r, primary, 1.0)
    assert isinstance(other, Lease) and other.replica_id == "r1"
    # A one-replica fleet whose only slot holds the primary is saturated.
    single = fleet(1)
    only = primary_on(single, 0.0)
    assert policy.may_hedge(0.05, single, only, 1.0) == NoHedge(HedgeDeclined.SATURATED)


def test_no_spare_besides_the_primary() -> None:
    clock = ManualClock()
    policy = HedgePolicy(
        clock, HedgeConfig(min_samples=1, delay_refresh_s=0.0, max_utilization=1.0)
    )
    policy.record_latency(0.01)
    for _ in range(40):
        policy.record_dispatch()
    r = fleet(2, slots=2)
    primary = primary_on(r, 0.0, "r0")
    busy = r.pick(0.0, exclude={"r0"})
    busy2 = r.pick(0.0, exclude={"r0"})
    assert isinstance(busy, Lease) and isinstance(busy2, Lease)
    assert policy.may_hedge(0.05, r, primary, 1.0) == NoHedge(HedgeDeclined.NO_SPARE)


def test_stands_down_near_saturation() -> None:
    clock = ManualClock()
    policy = warmed(clock)
    r = fleet(10)
    primary = primary_on(r, 0.0)
    for _ in range(8):  # 9 of 10 slots busy: 90 % >= max_utilization
        assert isinstance(r.pick(0.0), Lease)
    assert policy.may_hedge(0.05, r, primary, 1.0) == NoHedge(HedgeDeclined.SATURATED)


def test_hedges_never_go_to_a_half_open_replica() -> None:
    clock = ManualClock()
    policy = warmed(clock)
    r = fleet(2, slots=2)
    for _ in range(2):
        lease = r.pick(0.0, exclude={"r0"})
        assert isinstance(lease, Lease)
        r.complete(lease, Outcome.FAULT, None, 0.0)
    primary = primary_on(r, 1.5)  # r1 is half-open now and would accept a probe...
    probe = r.pick(1.5, exclude={"r0"})
    assert isinstance(probe, Lease) and probe.probe
    r.complete(probe, Outcome.CANCELLED, None, 1.5)
    # ...but a hedge is not a probe.
    assert policy.may_hedge(1.6, r, primary, 9.0) == NoHedge(HedgeDeclined.NO_SPARE)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=400), st.floats(min_value=0.0, max_value=0.2))
def test_budget_bounds_hedges_by_a_share_of_dispatches(ops: list[bool], ratio: float) -> None:
    budget = HedgeBudget(ratio, burst=3.0)
    dispatches = hedges = 0
    for is_dispatch in ops:
        if is_dispatch:
            budget.deposit()
            dispatches += 1
        elif budget.try_spend():
            hedges += 1
        assert hedges <= ratio * dispatches + 1e-6
        assert 0.0 <= budget.tokens <= 3.0


def test_budget_allows_about_one_hedge_per_twenty_dispatches() -> None:
    budget = HedgeBudget(0.05, burst=5.0)
    granted = 0
    for _ in range(1000):
        budget.deposit()
        granted += budget.try_spend()
    assert granted == 50


def test_policy_keeps_hedges_within_budget_under_constant_pressure() -> None:
    clock = ManualClock()
    policy = HedgePolicy(clock, HEDGE)
    r = fleet(4, slots=50)
    for _ in range(100):
        policy.record_latency(0.01)
    granted = 0
    for i in range(2000):
        now = i * 0.001
        clock.set(now)
        policy.record_dispatch()
        primary = r.pick(now)
        assert isinstance(primary, Lease)
        hedge = policy.may_hedge(now + 0.05, r, primary, now + 5.0)
        r.complete(primary, Outcome.SUCCESS, 0.01, now)
        if isinstance(hedge, Lease):
            granted += 1
            r.complete(hedge, Outcome.CANCELLED, None, now)
        policy.record_latency(0.01)
    assert granted == policy.hedges
    assert granted <= 0.05 * policy.dispatches + 1e-6
    assert granted >= 0.05 * policy.dispatches - 1  # and the budget does get used


def _lease(r: PeakEwmaRouter) -> Lease:
    result = r.pick(0.0)
    assert not isinstance(result, NoCapacity)
    return result


def test_race_first_success_wins_and_cancels_the_rest() -> None:
    r = fleet(3)
    primary, hedge = _lease(r), _lease(r)
    race = HedgeRace(primary)
    race.add_hedge(hedge)
    result = race.settle(hedge, ok=True)
    assert result.verdict is RaceVerdict.WON and result.winner is hedge
    assert result.cancel == (primary,)
    # The cancelled loser reporting later changes nothing.
    late = race.settle(primary, ok=False)
    assert late.verdict is RaceVerdict.WON and late.winner is hedge and late.cancel == ()


def test_race_a_fast_failing_hedge_does_not_kill_a_healthy_primary() -> None:
    r = fleet(3)
    primary, hedge = _lease(r), _lease(r)
    race = HedgeRace(primary)
    race.add_hedge(hedge)
    assert race.settle(hedge, ok=False).verdict is RaceVerdict.PENDING
    result = race.settle(primary, ok=True)
    assert result.verdict is RaceVerdict.WON and result.winner is primary


def test_race_lost_only_when_every_attempt_failed() -> None:
    r = fleet(3)
    primary, hedge = _lease(r), _lease(r)
    race = HedgeRace(primary)
    assert race.settle(primary, ok=False).verdict is RaceVerdict.LOST
    with pytest.raises(RuntimeError):
        race.add_hedge(hedge)
    race2 = HedgeRace(primary)
    race2.add_hedge(hedge)
    assert race2.settle(primary, ok=False).verdict is RaceVerdict.PENDING
    assert race2.settle(hedge, ok=False).verdict is RaceVerdict.LOST
    assert race2.settled and race2.hedged
