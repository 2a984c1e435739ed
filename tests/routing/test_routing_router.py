"""PeakEwmaRouter: eligibility, P2C on peak-EWMA cost, outcome handling, exactly-once release,
and computed no-capacity advice."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.rng import SeededRng
from gateway.routing import (
    BreakerConfig,
    BreakerState,
    Lease,
    NoCapacity,
    NoCapacityReason,
    Outcome,
    PeakEwmaRouter,
    ReplicaSpec,
    RouterConfig,
    peak_ewma_cost,
)

BREAKER = BreakerConfig(
    min_requests=3, base_backoff_s=1.0, max_backoff_s=8.0, half_open_successes=1
)
CONFIG = RouterConfig(ewma_tau_s=1.0, breaker=BREAKER)


def set_draining(r: PeakEwmaRouter, name: str, draining: bool = True, now: float = 0.0) -> None:
    """Hand the router the member's new record, as the membership owner does."""
    spec = r.member(name)
    assert isinstance(spec, ReplicaSpec)
    r.upsert(dataclasses.replace(spec, draining=draining), now)


class ScriptedRng:
    """An Rng whose randrange answers come from a script (then always 0)."""

    def __init__(self, draws: Iterable[int] = ()) -> None:
        self.draws = list(draws)

    def random(self) -> float:
        return 0.0

    def randrange(self, n: int) -> int:
        value = self.draws.pop(0) if self.draws else 0
        assert 0 <= value < n
        return value


def router(*specs: ReplicaSpec, rng: object | None = None) -> PeakEwmaRouter:
    r = PeakEwmaRouter(rng or SeededRng(1), CONFIG)  # type: ignore[arg-type]
    for spec in specs:
        r.upsert(spec, 0.0)
    return r


def lease_of(result: Lease | NoCapacity) -> Lease:
    assert isinstance(result, Lease), result
    return result


def trip(r: PeakEwmaRouter, replica_id: str, now: float) -> None:
    others = [x for x in r.replica_ids() if x != replica_id]
    for _ in range(BREAKER.min_requests):
        lease = lease_of(r.pick(now, exclude=others))
        assert lease.replica_id == replica_id
        r.complete(lease, Outcome.FAULT, None, now)


def view(r: PeakEwmaRouter, replica_id: str, now: float):  # type: ignore[no-untyped-def]
    return next(v for v in r.views(now) if v.replica_id == replica_id)


def test_cost_formula() -> None:
    assert peak_ewma_cost(0, 0.02, 1.0) == pytest.approx(0.02)
    assert peak_ewma_cost(3, 0.02, 2.0) == pytest.approx(0.04)


def test_p2c_picks_the_cheaper_of_the_two_drawn() -> None:
    specs = [ReplicaSpec(f"r{i}", slots=4, prior_latency_s=0.01 * (i + 1)) for i in range(4)]
    # Draw indices 3 then 0 (second draw 0 < 3 stays 0): r3 (40 ms) vs r0 (10 ms) -> r0.
    r = router(*specs, rng=ScriptedRng([3, 0]))
    assert lease_of(r.pick(0.0)).replica_id == "r0"
    # Draw 1 then 1 -> second index skips the first: r1 (20 ms) vs r2 (30 ms) -> r1.
    r = router(*specs, rng=ScriptedRng([1, 1]))
    assert lease_of(r.pick(0.0)).replica_id == "r1"


def test_p2c_counts_inflight_and_weight() -> None:
    r = router(
        ReplicaSpec("a", slots=8, prior_latency_s=0.010),
        ReplicaSpec("b", slots=8, prior_latency_s=0.025),
        rng=ScriptedRng([0, 0] * 10),
    )
    # a costs 10, 20, 30 ms as it fills; b costs 25 ms: the third pick goes to b.
    picks = [lease_of(r.pick(0.0)).replica_id for _ in range(3)]
    assert picks == ["a", "a", "b"]
    heavy = router(
        ReplicaSpec("a", slots=8, prior_latency_s=0.010),
        ReplicaSpec("b", slots=8, prior_latency_s=0.025, weight=4.0),
        rng=ScriptedRng([0, 0]),
    )
    assert lease_of(heavy.pick(0.0)).replica_id == "b"  # 25 / 4 < 10


def test_slot_ceiling_is_a_hard_filter() -> None:
    r = router(ReplicaSpec("slow", slots=1, prior_latency_s=0.001), ReplicaSpec("x", slots=1))
    first = lease_of(r.pick(0.0, exclude={"x"}))
    assert first.replica_id == "slow"
    for _ in range(20):
        lease = lease_of(r.pick(0.0))
        assert lease.replica_id == "x"
        r.complete(lease, Outcome.SUCCESS, 0.01, 0.0)


def test_draining_expired_and_open_replicas_are_never_chosen() -> None:
    r = router(*(ReplicaSpec(n, slots=10, prior_latency_s=0.01) for n in "abcd"))
    set_draining(r, "a")
    r.renew_lease("b", 5.0)
    trip(r, "c", 5.0)

    def chosen() -> set[str]:
        seen = set()
        for _ in range(50):
            lease = lease_of(r.pick(5.0))
            seen.add(lease.replica_id)
            r.complete(lease, Outcome.SUCCESS, 0.01, 5.0)
        return seen

    assert chosen() == {"d"}
    set_draining(r, "a", False)
    r.renew_lease("b", None)
    assert chosen() == {"a", "b", "d"}


def test_probe_slot_is_taken_only_by_the_chosen_replica() -> None:
    r = router(*(ReplicaSpec(n, slots=10, prior_latency_s=0.01) for n in ("a", "b")))
    trip(r, "a", 0.0)
    trip(r, "b", 0.0)
    # Both half-open at t=1: both eligible, one probe slot each.
    lease = lease_of(r.pick(1.0))
    chosen, other = lease.replica_id, ({"a", "b"} - {lease.replica_id}).pop()
    assert lease.probe
    assert view(r, chosen, 1.0).eligible is False  # its single probe slot is in use
    other_view = view(r, other, 1.0)
    assert other_view.breaker is BreakerState.HALF_OPEN and other_view.eligible
    second = lease_of(r.pick(1.0))
    assert second.replica_id == other and second.probe


def test_busy_never_trips_a_breaker_nor_feeds_latency() -> None:
    r = router(ReplicaSpec("a", slots=1, prior_latency_s=0.05))
    before = r.latency_estimate("a", 0.0)
    for i in range(500):
        now = i * 0.001
        r.complete(lease_of(r.pick(now)), Outcome.BUSY, 0.0001, now)
    v = view(r, "a", 0.5)
    assert v.breaker is BreakerState.CLOSED
    assert r.latency_estimate("a", 0.5) == before


def test_cancelled_touches_nothing_and_fault_feeds_no_latency() -> None:
    r = router(ReplicaSpec("a", slots=1, prior_latency_s=0.05))
    r.complete(lease_of(r.pick(0.0)), Outcome.CANCELLED, 0.0001, 0.0)
    r.complete(lease_of(r.pick(0.0)), Outcome.FAULT, 0.0001, 0.0)
    assert r.latency_estimate("a", 0.0) == pytest.approx(0.05)
    assert view(r, "a", 0.0).inflight == 0


def test_peak_ewma_jumps_up_at_once_and_idles_back_toward_the_prior() -> None:
    r = router(ReplicaSpec("a", slots=1, prior_latency_s=0.02))
    r.complete(lease_of(r.pick(0.0)), Outcome.SUCCESS, 0.2, 0.0)
    assert r.latency_estimate("a", 0.0) == pytest.approx(0.2)
    r.complete(lease_of(r.pick(0.0)), Outcome.SUCCESS, 0.01, 0.0)
    assert r.latency_estimate("a", 0.0) == pytest.approx(0.2)  # no time passed: no blend
    late = r.latency_estimate("a", 60.0)
    assert late is not None and late == pytest.approx(0.02, rel=1e-6)  # the prior, not zero


def test_replica_without_advertised_speed_gets_the_fleet_median_prior() -> None:
    r = router(
        ReplicaSpec("a", prior_latency_s=0.01),
        ReplicaSpec("b", prior_latency_s=0.03),
        ReplicaSpec("c", prior_latency_s=0.05),
        ReplicaSpec("new"),
    )
    assert r.latency_estimate("new", 0.0) == pytest.approx(0.03)
    lone = router(ReplicaSpec("only"))
    assert lone.latency_estimate("only", 0.0) == pytest.approx(CONFIG.default_prior_latency_s)


def test_double_release_is_a_no_op() -> None:
    r = router(ReplicaSpec("a", slots=2))
    lease = lease_of(r.pick(0.0))
    assert r.complete(lease, Outcome.SUCCESS, 0.01, 0.0) is True
    assert r.complete(lease, Outcome.CANCELLED, None, 0.0) is False
    assert r.complete(lease, Outcome.FAULT, None, 0.0) is False
    assert view(r, "a", 0.0).inflight == 0
    assert lease.released


def test_membership_changes_keep_state_and_removal_releases_quietly() -> None:
    r = router(ReplicaSpec("a", slots=1, prior_latency_s=0.01))
    lease = lease_of(r.pick(0.0))
    r.upsert(ReplicaSpec("a", slots=2, prior_latency_s=0.01), 0.0)
    assert view(r, "a", 0.0).inflight == 1 and view(r, "a", 0.0).eligible
    assert r.remove("a")
    assert r.complete(lease, Outcome.SUCCESS, 0.01, 0.0) is True
    r.upsert(ReplicaSpec("a", slots=1), 0.0)  # re-added: a fresh replica
    assert view(r, "a", 0.0).inflight == 0


def test_no_replica() -> None:
    r = router()
    result = r.pick(0.0)
    assert isinstance(result, NoCapacity)
    assert result.reason is NoCapacityReason.NO_REPLICA
    assert result.error_reason == "NO_CAPACITY"
    r.upsert(ReplicaSpec("a", draining=True), 0.0)
    result = r.pick(0.0)
    assert isinstance(result, NoCapacity) and result.reason is NoCapacityReason.NO_REPLICA


def test_all_busy_advises_the_predicted_time_until_a_slot_frees() -> None:
    r = router(
        ReplicaSpec("a", slots=1, prior_latency_s=0.100),
        ReplicaSpec("b", slots=1, prior_latency_s=0.300),
    )
    lease_of(r.pick(0.0, exclude={"b"}))
    lease_of(r.pick(0.040, exclude={"a"}))
    result = r.pick(0.050)
    assert isinstance(result, NoCapacity)
    assert result.reason is NoCapacityReason.ALL_BUSY
    assert result.retry_after_s == pytest.approx(0.050)  # a started at 0, takes ~100 ms


def test_all_breakers_open_advises_the_earliest_reopen() -> None:
    r = router(*(ReplicaSpec(n, slots=5) for n in ("a", "b")))
    trip(r, "a", 0.0)
    trip(r, "b", 0.4)
    result = r.pick(0.5)
    assert isinstance(result, NoCapacity)
    assert result.reason is NoCapacityReason.ALL_BREAKERS_OPEN
    assert result.retry_after_s == pytest.approx(0.5)  # a re-opens at 1.0


def test_fast_failing_replica_is_starved_once_its_breaker_opens() -> None:
    """A black hole (fails in 2 ms) gets < 1 % of traffic after its breaker opens."""
    rng = SeededRng(42)
    r = PeakEwmaRouter(rng, RouterConfig(breaker=BreakerConfig()))
    for name, prior in (("fast", 0.02), ("slow", 0.035), ("hole", 0.02)):
        r.upsert(ReplicaSpec(name, slots=1_000, prior_latency_s=prior), 0.0)
    sent = {"fast": 0, "slow": 0, "hole": 0}
    opened_at: float | None = None
    after_open = {"fast": 0, "slow": 0, "hole": 0}
    now = 0.0
    for _ in range(20_000):  # 200 req/s for 100 s, each finishing before the next
        now += 0.005
        lease = lease_of(r.pick(now))
        sent[lease.replica_id] += 1
        if opened_at is not None:
            after_open[lease.replica_id] += 1
        if lease.replica_id == "hole":
            r.complete(lease, Outcome.FAULT, None, now + 0.002)
        else:
            r.complete(lease, Outcome.SUCCESS, r.latency_estimate(lease.replica_id, now), now)
        if opened_at is None and view(r, "hole", now).breaker is BreakerState.OPEN:
            opened_at = now
    assert opened_at is not None and opened_at < 1.0
    assert after_open["hole"] / sum(after_open.values()) < 0.01
    assert sent["hole"] / sum(sent.values()) < 0.01


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["pick", "complete", "again", "drain", "remove", "add"]),
            st.sampled_from(list(Outcome)),
            st.integers(min_value=0, max_value=50),
        ),
        max_size=150,
    )
)
def test_inflight_is_released_exactly_once_per_lease(
    ops: list[tuple[str, Outcome, int]],
) -> None:
    r = router(*(ReplicaSpec(n, slots=3, prior_latency_s=0.01) for n in "abc"))
    outstanding: list[Lease] = []
    done: list[Lease] = []
    now = 0.0
    for op, outcome, k in ops:
        now += 0.01
        if op == "pick":
            result = r.pick(now)
            if isinstance(result, Lease):
                outstanding.append(result)
            else:
                assert result.retry_after_s > 0 and math.isfinite(result.retry_after_s)
        elif op == "complete" and outstanding:
            lease = outstanding.pop(k % len(outstanding))
            assert r.complete(lease, outcome, 0.01, now)
            done.append(lease)
        elif op == "again" and done:
            assert not r.complete(done[k % len(done)], outcome, 0.01, now)
        elif op == "drain" and "abc"[k % 3] in r:
            set_draining(r, "abc"[k % 3], k % 2 == 0, now)
        elif op == "remove":
            name = "abc"[k % 3]
            r.remove(name)
            # Leases on a removed replica no longer count anywhere.
            outstanding = [lease for lease in outstanding if lease.replica_id != name]
        elif op == "add":
            name = "abc"[k % 3]
            if name not in r:
                r.upsert(ReplicaSpec(name, slots=3, prior_latency_s=0.01), now)
        for v in r.views(now):
            mine = sum(1 for lease in outstanding if lease.replica_id == v.replica_id)
            assert v.inflight == mine
            assert 0 <= v.inflight <= v.slots


# -- timeouts and bad numbers (ADR 0011) -------------------------------------------------------


def test_a_timeout_is_a_latency_lower_bound_and_steers_traffic_away() -> None:
    r = router(
        ReplicaSpec("a", slots=4, prior_latency_s=0.05),
        ReplicaSpec("b", slots=4, prior_latency_s=0.05),
    )
    r.complete(lease_of(r.pick(0.0, exclude={"b"})), Outcome.TIMEOUT, 0.25, 0.25)
    assert r.latency_estimate("a", 0.25) == pytest.approx(0.25)  # believed at once
    assert view(r, "a", 0.25).breaker is BreakerState.CLOSED  # one timeout: not yet open
    # Power of two choices now prefers b however the draw falls, before any breaker opens.
    picks = {lease_of(r.pick(0.3)).replica_id for _ in range(3)}
    assert picks == {"b"}


def test_two_timeouts_in_a_row_stop_new_work_at_once() -> None:
    r = router(ReplicaSpec("a", slots=2, prior_latency_s=0.05), ReplicaSpec("b", slots=2))
    busy = [lease_of(r.pick(0.0, exclude={"b"})) for _ in range(2)]
    for lease in busy:
        r.complete(lease, Outcome.TIMEOUT, None, 0.25)
    assert view(r, "a", 0.25).breaker is BreakerState.OPEN
    assert {lease_of(r.pick(0.3)).replica_id for _ in range(2)} == {"b"}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Outcome)),
            st.one_of(
                st.none(),
                st.floats(allow_nan=True, allow_infinity=True),
                st.floats(0.0, 10.0),
            ),
            st.floats(0.0, 1.0),
        ),
        max_size=80,
    )
)
@settings(max_examples=200)
def test_no_outcome_or_number_makes_an_estimate_nan_or_unbounded(
    ops: list[tuple[Outcome, float | None, float]],
) -> None:
    r = router(ReplicaSpec("a", slots=2, prior_latency_s=0.05), ReplicaSpec("b", slots=2))
    now = 0.0
    largest = 0.05  # the estimate stays within the prior and the real samples seen
    for outcome, latency, step in ops:
        now += step
        lease = r.pick(now)
        if isinstance(lease, Lease):
            r.complete(lease, outcome, latency, now)
            sample = now - lease.dispatched_at if latency is None else latency
            if math.isfinite(sample):
                largest = max(largest, sample)
        for v in r.views(now):
            assert math.isfinite(v.latency_estimate_s) and v.latency_estimate_s >= 0.0
            assert math.isfinite(v.cost) and v.cost >= 0.0
            assert v.latency_estimate_s <= largest
