"""Attempt timeouts and answer-by times (ADR 0011): pure numbers, no clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.routing import AttemptConfig, AttemptPolicy, Outcome

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
        {"cold_timeout_s": math.nan},
        {"answer_reserve_s": -1.0},
        {"max_reserve_share": 1.0},
    ],
)
def test_config_is_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AttemptConfig(**kwargs)


def test_a_replica_with_no_prediction_yet_gets_the_cold_timeout() -> None:
    policy = AttemptPolicy(AttemptConfig(min_timeout_s=0.25, cold_timeout_s=1.0))
    assert policy.attempt_timeout(None) == pytest.approx(1.0)
    assert policy.call_timeout(0.0, None, 0.4) == pytest.approx(0.4)
    assert policy.judge_expiry(0.3, None) is Outcome.TIMEOUT  # past the floor: judged
    assert policy.judge_expiry(0.1, None) is Outcome.CANCELLED


def test_the_fleets_successful_tail_raises_the_floor_on_a_slow_host() -> None:
    # Every call is slow on a starved host: an attempt may take twice the recent p95 of
    # successful calls, whatever the device-time prediction says.
    assert POLICY.attempt_timeout(0.01, tail_s=0.8) == pytest.approx(1.6)
    assert POLICY.attempt_timeout(None, tail_s=0.8) == pytest.approx(1.6)  # above the cold 1 s
    assert POLICY.attempt_timeout(2.0, tail_s=0.8) == pytest.approx(8.0)  # the prediction rules
    assert POLICY.attempt_timeout(0.01, tail_s=0.05) == pytest.approx(0.25)  # the floor
    for bad in (float("nan"), float("inf"), -1.0):
        assert POLICY.attempt_timeout(0.01, tail_s=bad) == pytest.approx(0.25)
    assert POLICY.call_timeout(10.0, 0.01, 10.0 + 1.0, tail_s=0.8) == pytest.approx(1.0)
