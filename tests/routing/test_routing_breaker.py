"""Circuit breaker rules: trip on a failure ratio over a minimum count, exponential backoff,
bounded half-open probes, and outcomes that carry no verdict never move it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing.breaker import BreakerConfig, BreakerState, CircuitBreaker, Probe

CFG = BreakerConfig(
    failure_ratio=0.5,
    min_requests=4,
    window_s=10.0,
    window_buckets=10,
    base_backoff_s=1.0,
    backoff_multiplier=2.0,
    max_backoff_s=5.0,
    half_open_max_probes=2,
    half_open_successes=2,
)


def tripped(now: float = 0.0) -> CircuitBreaker:
    b = CircuitBreaker(CFG)
    for _ in range(CFG.min_requests):
        b.on_failure(now, b.on_dispatch(now))
    assert b.state(now) is BreakerState.OPEN
    return b


def test_does_not_trip_below_min_count_even_at_100_percent_failures() -> None:
    b = CircuitBreaker(CFG)
    for _ in range(CFG.min_requests - 1):
        b.on_failure(0.0, b.on_dispatch(0.0))
    assert b.state(0.0) is BreakerState.CLOSED


def test_trips_when_failure_ratio_reached_over_min_count() -> None:
    b = CircuitBreaker(CFG)
    for _ in range(3):
        b.on_success(0.0, b.on_dispatch(0.0))
    for _ in range(2):
        b.on_failure(0.0, b.on_dispatch(0.0))
    assert b.state(0.0) is BreakerState.CLOSED  # 2 / 5 = 40 % < 50 %
    b.on_failure(0.0, b.on_dispatch(0.0))
    assert b.state(0.0) is BreakerState.OPEN  # 3 / 6 = 50 %


def test_old_failures_leave_the_window() -> None:
    b = CircuitBreaker(CFG)
    for _ in range(3):
        b.on_failure(0.0, None)
    # Eleven seconds later those failures are out of the 10 s window.
    b.on_failure(11.0, None)
    assert b.state(11.0) is BreakerState.CLOSED
    b.on_failure(11.0, None)
    b.on_failure(11.0, None)
    b.on_failure(11.0, None)
    assert b.state(11.0) is BreakerState.OPEN


def test_busy_and_cancelled_never_trip_the_breaker() -> None:
    b = CircuitBreaker(CFG)
    for i in range(1000):
        b.on_release(i * 0.001, b.on_dispatch(i * 0.001))
    assert b.state(1.0) is BreakerState.CLOSED
    assert b.trips == 0


def test_open_for_backoff_then_half_open() -> None:
    b = tripped(0.0)
    assert not b.allows(0.999)
    assert b.reopen_at(0.5) == pytest.approx(1.0)
    assert b.state(1.0) is BreakerState.HALF_OPEN
    assert b.allows(1.0)


def test_backoff_grows_exponentially_and_is_capped() -> None:
    b = tripped(0.0)
    now = 0.0
    expected = [1.0, 2.0, 4.0, 5.0, 5.0]
    for backoff in expected:
        reopen = b.reopen_at(now)
        assert reopen is not None
        assert reopen - now == pytest.approx(backoff)
        now = reopen
        probe = b.on_dispatch(now)
        assert probe is not None
        b.on_failure(now, probe)  # the probe fails: open again, longer
    assert b.trips == len(expected) + 1


def test_backoff_resets_after_closing() -> None:
    b = tripped(0.0)
    b.on_failure(1.0, b.on_dispatch(1.0))  # second trip: 2 s
    assert b.reopen_at(1.0) == pytest.approx(3.0)
    for _ in range(CFG.half_open_successes):
        b.on_success(3.0, b.on_dispatch(3.0))
    assert b.state(3.0) is BreakerState.CLOSED
    for _ in range(CFG.min_requests):
        b.on_failure(4.0, None)
    assert b.reopen_at(4.0) == pytest.approx(5.0)  # back to the base backoff


def test_half_open_admits_a_bounded_number_of_probes() -> None:
    b = tripped(0.0)
    probes = [b.on_dispatch(1.0) for _ in range(CFG.half_open_max_probes)]
    assert all(p is not None for p in probes)
    assert not b.allows(1.0)
    with pytest.raises(RuntimeError):
        b.on_dispatch(1.0)


def test_allows_is_a_pure_query() -> None:
    """Asking every candidate must not consume probe slots (the original's leak)."""
    b = tripped(0.0)
    for _ in range(100):
        assert b.allows(1.0)
    assert b.probes_inflight == 0


def test_released_probe_slot_can_be_reused_and_gives_no_verdict() -> None:
    b = tripped(0.0)
    p1 = b.on_dispatch(1.0)
    p2 = b.on_dispatch(1.0)
    assert not b.allows(1.0)
    b.on_release(1.1, p1)  # busy: no verdict, slot back
    assert b.allows(1.1)
    assert b.state(1.1) is BreakerState.HALF_OPEN
    b.on_success(1.2, p2)
    assert b.state(1.2) is BreakerState.HALF_OPEN  # one success of two needed
    b.on_success(1.3, b.on_dispatch(1.3))
    assert b.state(1.3) is BreakerState.CLOSED


def test_probe_failure_reopens() -> None:
    b = tripped(0.0)
    b.on_success(1.0, b.on_dispatch(1.0))
    b.on_failure(1.0, b.on_dispatch(1.0))
    assert b.state(1.0) is BreakerState.OPEN


def test_stale_outcomes_are_ignored() -> None:
    b = CircuitBreaker(CFG)
    in_flight_before_trip = b.on_dispatch(0.0)
    for _ in range(CFG.min_requests):
        b.on_failure(0.0, None)
    assert b.state(0.0) is BreakerState.OPEN
    # A request dispatched while closed succeeds late: it must not close the breaker.
    b.on_success(0.5, in_flight_before_trip)
    assert b.state(0.5) is BreakerState.OPEN
    # A probe from an earlier half-open episode reports after a new episode began.
    old_probe = b.on_dispatch(1.0)
    b.on_failure(1.0, b.on_dispatch(1.0))  # reopen for 2 s
    assert b.state(3.0) is BreakerState.HALF_OPEN
    b.on_success(3.0, old_probe)
    b.on_success(3.0, old_probe)
    assert b.state(3.0) is BreakerState.HALF_OPEN
    assert b.probes_inflight == 0


def test_huge_trip_counts_do_not_overflow() -> None:
    b = tripped(0.0)
    now = 0.0
    for _ in range(2000):
        reopen = b.reopen_at(now)
        assert reopen is not None
        now = reopen
        b.on_failure(now, b.on_dispatch(now))
    assert b.reopen_at(now) == pytest.approx(now + CFG.max_backoff_s)


ops = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "success", "failure", "release"]),
        st.floats(min_value=0.0, max_value=0.5),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_state_machine_invariants(sequence: list[tuple[str, float]]) -> None:
    b = CircuitBreaker(CFG)
    now = 0.0
    outstanding: list[Probe | None] = []
    for op, dt in sequence:
        now += dt
        if op == "dispatch":
            if b.allows(now):
                outstanding.append(b.on_dispatch(now))
            else:
                with pytest.raises(RuntimeError):
                    b.on_dispatch(now)
        elif outstanding:
            probe = outstanding.pop(0)
            {"success": b.on_success, "failure": b.on_failure, "release": b.on_release}[op](
                now, probe
            )
        state = b.state(now)
        assert 0 <= b.probes_inflight <= CFG.half_open_max_probes
        if state is BreakerState.OPEN:
            assert not b.allows(now)
            reopen = b.reopen_at(now)
            assert reopen is not None and now < reopen <= now + CFG.max_backoff_s
        if state is BreakerState.CLOSED:
            assert b.allows(now) and b.trips == 0


# -- timeouts (ADR 0011) -----------------------------------------------------------------------


def test_consecutive_timeouts_open_the_breaker_whatever_the_window_holds() -> None:
    b = CircuitBreaker(CFG)  # consecutive_timeouts = 2 by default
    for _ in range(100):  # a busy, healthy past: the ratio rule alone would need 100 failures
        b.on_success(0.0, b.on_dispatch(0.0))
    b.on_timeout(1.0, b.on_dispatch(1.0))
    assert b.state(1.0) is BreakerState.CLOSED
    b.on_timeout(1.1, b.on_dispatch(1.1))
    assert b.state(1.1) is BreakerState.OPEN
    assert b.reopen_at(1.1) == pytest.approx(2.1)


def test_a_success_between_timeouts_resets_the_count_and_errors_do_not_count() -> None:
    b = CircuitBreaker(BreakerConfig(min_requests=1000, consecutive_timeouts=2))
    b.on_timeout(0.0, b.on_dispatch(0.0))
    b.on_success(0.1, b.on_dispatch(0.1))
    b.on_timeout(0.2, b.on_dispatch(0.2))
    assert b.state(0.2) is BreakerState.CLOSED
    b.on_failure(0.3, b.on_dispatch(0.3))  # a fast error: judged by the ratio rule only
    assert b.state(0.3) is BreakerState.CLOSED
    b.on_timeout(0.4, b.on_dispatch(0.4))
    assert b.state(0.4) is BreakerState.OPEN


def test_a_timed_out_probe_reopens_with_the_next_backoff() -> None:
    b = tripped(0.0)
    assert b.state(1.0) is BreakerState.HALF_OPEN
    b.on_timeout(1.5, b.on_dispatch(1.0))
    assert b.state(1.5) is BreakerState.OPEN
    assert b.reopen_at(1.5) == pytest.approx(3.5)  # second trip: 2 s


def test_timeouts_of_attempts_dispatched_before_it_opened_change_nothing() -> None:
    b = CircuitBreaker(CFG)
    early = [b.on_dispatch(0.0) for _ in range(3)]
    b.on_timeout(0.3, early[0])
    b.on_timeout(0.3, early[1])
    assert b.state(0.3) is BreakerState.OPEN
    b.on_timeout(0.4, early[2])  # dispatched while closed, lands while open: no new trip
    assert b.trips == 1


def test_consecutive_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="consecutive_timeouts"):
        BreakerConfig(consecutive_timeouts=0)
