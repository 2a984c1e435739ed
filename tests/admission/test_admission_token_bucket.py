"""Token bucket: refill, burst cap, exact retry advice, charge-then-refund, big requests."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import TokenBucket


def test_starts_full_and_refills_at_rate_up_to_burst() -> None:
    b = TokenBucket(rate=100.0, burst=500.0, now=0.0)
    assert b.tokens(0.0) == 500.0
    assert b.take(400.0, 0.0)
    assert b.tokens(1.0) == pytest.approx(200.0)
    assert b.tokens(100.0) == 500.0


def test_retry_advice_is_the_refill_time() -> None:
    b = TokenBucket(rate=100.0, burst=500.0, now=0.0, tokens=50.0)
    assert not b.take(200.0, 0.0)
    wait = b.time_until(200.0, 0.0)
    assert wait == pytest.approx(1.5)
    assert not b.can_take(200.0, 1.49)
    assert b.take(200.0, 1.5)


def test_nothing_is_charged_by_asking() -> None:
    b = TokenBucket(rate=1.0, burst=10.0, now=0.0)
    for _ in range(100):
        b.time_until(7.0, 0.0)
        b.can_take(7.0, 0.0)
    assert b.tokens(0.0) == 10.0


def test_refund_is_capped_at_burst() -> None:
    b = TokenBucket(rate=1.0, burst=10.0, now=0.0)
    assert b.take(6.0, 0.0)
    b.refund(6.0, 0.0)
    assert b.tokens(0.0) == 10.0
    b.refund(6.0, 0.0)
    assert b.tokens(0.0) == 10.0


def test_request_larger_than_burst_waits_for_a_full_bucket_then_goes_into_debt() -> None:
    b = TokenBucket(rate=10.0, burst=100.0, now=0.0, tokens=40.0)
    assert b.time_until(250.0, 0.0) == pytest.approx(6.0)  # until the bucket is full
    assert b.take(250.0, 6.0)
    assert b.tokens(6.0) == pytest.approx(-150.0)
    assert b.time_until(1.0, 6.0) == pytest.approx(15.1)


def test_zero_rate_never_refills() -> None:
    b = TokenBucket(rate=0.0, burst=5.0, now=0.0)
    assert b.take(5.0, 0.0)
    assert math.isinf(b.time_until(1.0, 1e9))


def test_clock_going_backwards_adds_nothing() -> None:
    b = TokenBucket(rate=10.0, burst=100.0, now=10.0, tokens=0.0)
    assert b.tokens(5.0) == 0.0
    assert b.tokens(11.0) == pytest.approx(10.0)


def test_reconfigure_keeps_balance_capped() -> None:
    b = TokenBucket(rate=10.0, burst=100.0, now=0.0)
    b.reconfigure(rate=1.0, burst=30.0, now=0.0)
    assert b.tokens(0.0) == 30.0
    assert b.time_until(31.0, 0.0) == 0.0  # capped at the new burst: a full bucket suffices


def test_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=-1.0, burst=1.0, now=0.0)
    with pytest.raises(ValueError):
        TokenBucket(rate=1.0, burst=0.0, now=0.0)
    b = TokenBucket(rate=1.0, burst=1.0, now=0.0)
    with pytest.raises(ValueError):
        b.take(math.nan, 0.0)
    with pytest.raises(ValueError):
        b.refund(-1.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=0.1, max_value=1000.0),
    st.floats(min_value=1.0, max_value=1000.0),
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=2.0), st.floats(min_value=0.0, max_value=2000.0)
        ),
        max_size=60,
    ),
)
def test_advice_is_exact_and_balance_never_exceeds_burst(
    rate: float, burst: float, ops: list[tuple[float, float]]
) -> None:
    b = TokenBucket(rate, burst, now=0.0)
    now = 0.0
    for dt, cost in ops:
        now += dt
        wait = b.time_until(cost, now)
        if wait > 0:
            assert not b.take(cost, now)
            if wait > 1e-6:
                assert not b.can_take(cost, now + wait * 0.999)
            assert b.take(cost, now + wait + 1e-9)
            now += wait + 1e-9
        else:
            assert b.take(cost, now)
        assert b.tokens(now) <= burst + 1e-9
