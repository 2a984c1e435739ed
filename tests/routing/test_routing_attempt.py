"""Attempt timeouts, answer-by times and proven cost floors (ADR 0011): pure numbers, no
clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.routing import AttemptConfig, AttemptPolicy, CostFloor, Outcome

POLICY = AttemptPolicy(AttemptConfig(timeout_multiplier=4.0, min_timeout_s=0.25))


def test_attempt_timeout_follows_the_prediction_above_a_floor() -> None:
    assert POLICY.attempt_timeout(0.1) == pytest.approx(0.4)
    assert POLICY.attempt_timeout(0.01) == pytest.approx(0.25)  # the floor
    assert POLICY.attempt_timeout(2.0) == pytest.approx(8.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0])
def test_a_prediction_that_is_not_a_duration_gets_the_floor(bad: float) -> None:
    assert POLICY.attempt_timeout(bad) == 0.25


def test_call_timeout_is_the_attempt_timeout_cut_at_the_last_answer_by() -> None:
    # A request with a 600 s deadline does not make the call wait 600 s on a frozen replica.
    assert POLICY.call_timeout(10.0, 0.05, 10.0 + 600.0) == pytest.approx(0.25)
    # A batch whose requests must all be answered in 0.1 s gets a 0.1 s call.
    assert POLICY.call_timeout(10.0, 0.05, 10.1) == pytest.approx(0.1)
    # Already past: the shortest call, never zero or negative.
    assert POLICY.call_timeout(10.0, 0.05, 9.0) == pytest.approx(0.001)


def test_answer_by_reserves_a_little_time_before_the_deadline() -> None:
    assert POLICY.answer_by(0.0, 2.0) == pytest.approx(1.99)  # 10 ms before a 2 s deadline
    assert POLICY.answer_by(0.0, 0.05) == pytest.approx(0.045)  # at most 10 % of the timeout
    assert POLICY.answer_by(5.0, 5.0) == pytest.approx(5.0)


def test_a_call_cut_short_by_deadlines_is_no_verdict_an_overdue_one_a_timeout() -> None:
    assert POLICY.judge_expiry(0.30, 0.08) is Outcome.TIMEOUT
    assert POLICY.judge_expiry(0.05, 0.08) is Outcome.CANCELLED
    assert POLICY.judge_expiry(0.05, math.nan) is Outcome.TIMEOUT


@given(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6),
    st.floats(0.0, 600.0),
)
def test_call_timeouts_are_always_finite_positive_and_bounded(
    predicted: float, now: float, budget: float
) -> None:
    timeout = POLICY.call_timeout(now, predicted, now + budget)
    assert math.isfinite(timeout)
    assert 0.001 <= timeout <= max(0.001, budget) + 1e-9 * (1.0 + abs(now))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_multiplier": 0.5},
        {"min_timeout_s": 0.0},
        {"min_timeout_s": math.nan},
        {"proven_multiplier": 1.0},
        {"answer_reserve_s": -1.0},
        {"max_reserve_share": 1.0},
    ],
)
def test_config_is_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AttemptConfig(**kwargs)


def test_a_replica_with_no_prediction_is_not_timed_out_by_a_constant() -> None:
    # A device whose batches take 30 s, before it answered once: the attempt may run until the
    # batch's requests must be answered — 90 s away here — never a constant second.
    assert POLICY.attempt_timeout(None) == math.inf
    assert POLICY.attempt_timeout(None, tail_s=0.8) == math.inf
    assert POLICY.call_timeout(0.0, None, 90.0) == pytest.approx(90.0)
    assert POLICY.call_timeout(0.0, None, 90.0, tail_s=0.05) == pytest.approx(90.0)
    assert POLICY.call_timeout(0.0, None, 0.4) == pytest.approx(0.4)
    assert POLICY.call_timeout(5.0, None, 4.0) == pytest.approx(0.001)  # past: never <= 0
    assert POLICY.judge_expiry(0.3, None) is Outcome.TIMEOUT  # past the floor: judged
    assert POLICY.judge_expiry(0.1, None) is Outcome.CANCELLED


@given(st.floats(-1e6, 1e6), st.floats(0.0, 600.0))
def test_with_no_prediction_the_call_runs_exactly_until_the_last_answer_by(
    now: float, budget: float
) -> None:
    timeout = POLICY.call_timeout(now, None, now + budget)
    assert math.isfinite(timeout)
    assert timeout == pytest.approx(max(0.001, (now + budget) - now), abs=1e-9 * (1 + abs(now)))


def test_the_fleets_successful_tail_raises_the_floor_on_a_slow_host() -> None:
    # Every call is slow on a starved host: an attempt may take twice the recent p95 of
    # successful calls, whatever the device-time prediction says.
    assert POLICY.attempt_timeout(0.01, tail_s=0.8) == pytest.approx(1.6)
    assert POLICY.attempt_timeout(2.0, tail_s=0.8) == pytest.approx(8.0)  # the prediction rules
    assert POLICY.attempt_timeout(0.01, tail_s=0.05) == pytest.approx(0.25)  # the floor
    for bad in (float("nan"), float("inf"), -1.0):
        assert POLICY.attempt_timeout(0.01, tail_s=bad) == pytest.approx(0.25)
    assert POLICY.call_timeout(10.0, 0.01, 10.0 + 1.0, tail_s=0.8) == pytest.approx(1.0)


# -- what a call that ran out of time proves ---------------------------------------------------


def test_a_call_out_of_time_is_a_floor_for_its_size_and_every_larger_batch() -> None:
    floor = CostFloor()
    assert floor.at(100) == 0.0
    floor.ran_out(100, 2.4)
    assert floor.at(100) == 2.4
    assert floor.at(10_000) == 2.4  # more work is not faster
    assert floor.at(99) == 0.0  # less work may be (a frozen device's fixed cost is unknown)
    floor.ran_out(100, 1.0)  # weaker than what is known: nothing new
    assert floor.bounds == [(100, 2.4)]
    floor.ran_out(50, 3.0)  # stronger and wider: the old bound says nothing more
    assert floor.bounds == [(50, 3.0)]
    floor.ran_out(400, 9.6)
    assert floor.bounds == [(50, 3.0), (400, 9.6)]
    assert floor.at(399) == 3.0 and floor.at(400) == 9.6


def test_a_faster_answer_refutes_a_floor_a_slower_one_does_not() -> None:
    floor = CostFloor()
    floor.ran_out(100, 2.4)
    floor.ran_out(400, 9.6)
    floor.answered(200, 5.0)  # slower than the 100-token bound: consistent with both
    assert floor.bounds == [(100, 2.4), (400, 9.6)]
    floor.answered(50, 0.1)  # smaller than either bound's batch: refutes nothing
    assert floor.bounds == [(100, 2.4), (400, 9.6)]
    floor.answered(150, 0.5)  # the replica thawed: the 100-token bound is refuted
    assert floor.bounds == [(400, 9.6)]
    floor.answered(500, 0.5)
    assert floor.bounds == [] and floor.at(10**6) == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0])
def test_a_floor_ignores_what_is_not_a_duration(bad: float) -> None:
    floor = CostFloor()
    floor.ran_out(100, bad)
    floor.answered(100, bad)
    assert floor.bounds == []


def test_a_floor_keeps_at_most_its_bound_count() -> None:
    floor = CostFloor(max_bounds=3)
    for i in range(1, 10):
        floor.ran_out(i * 10, float(i))
    assert len(floor.bounds) == 3 and floor.at(90) == 9.0
    with pytest.raises(ValueError):
        CostFloor(max_bounds=0)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5000), st.floats(0.0, 100.0)), max_size=40))
def test_a_floor_is_the_largest_unrefuted_bound_at_or_below_a_size(
    events: list[tuple[bool, int, float]],
) -> None:
    """Against a brute-force model of every bound no later, faster answer for a batch at least
    its size refuted: the floor never claims more than those prove (a refuted or unproven
    bound would time a healthy replica out), and exactly that while nothing was refuted."""
    floor = CostFloor(max_bounds=10_000)
    live: list[tuple[int, float]] = []
    refuted = False
    for timed_out, tokens, seconds in events:
        if timed_out:
            floor.ran_out(tokens, seconds)
            if seconds > 0.0:
                live.append((tokens, seconds))
        else:
            floor.answered(tokens, seconds)
            kept = [(t, s) for t, s in live if not (t <= tokens and s > seconds)]
            refuted = refuted or len(kept) != len(live)
            live = kept
    for probe in (0, 1, 10, 100, 1000, 5000, 10**6):
        proven = max((s for t, s in live if t <= probe), default=0.0)
        assert floor.at(probe) <= proven
        if not refuted:
            assert floor.at(probe) == proven
    tokens_seen = [t for t, _ in floor.bounds]
    assert tokens_seen == sorted(tokens_seen)


def test_lower_bounds_grow_an_attempt_until_a_slow_replica_answers() -> None:
    """A replica 20x slower than its model (a warm-up that was wrong, a degraded device): each
    timeout proves more, the next attempt waits twice that, and it answers on the fourth —
    instead of timing out for ever while cancelled attempts teach the model nothing."""
    predicted, real, tokens = 0.25, 5.0, 512
    floor = CostFloor()
    waits = []
    for _ in range(6):
        timeout = POLICY.attempt_timeout(predicted, proven_s=floor.at(tokens))
        waits.append(timeout)
        if timeout >= real:
            floor.answered(tokens, real)
            break
        floor.ran_out(tokens, timeout)
    assert waits == pytest.approx([1.0, 2.0, 4.0, 8.0])
    assert floor.at(tokens) == 4.0  # a 5 s answer does not refute "more than 4 s"


def test_what_was_proven_raises_the_timeout_and_ends_the_unbounded_wait() -> None:
    assert POLICY.attempt_timeout(0.1, proven_s=1.0) == pytest.approx(2.0)  # 2 x proven
    assert POLICY.attempt_timeout(1.0, proven_s=1.0) == pytest.approx(4.0)  # 4 x predicted
    # Nothing learned, but a call was cut at its answer-by after 3 s: 6 s next, not forever.
    assert POLICY.attempt_timeout(None, proven_s=3.0) == pytest.approx(6.0)
    assert POLICY.call_timeout(0.0, None, 90.0, proven_s=3.0) == pytest.approx(6.0)
    for bad in (math.nan, math.inf, -1.0, 0.0):
        assert POLICY.attempt_timeout(None, proven_s=bad) == math.inf
