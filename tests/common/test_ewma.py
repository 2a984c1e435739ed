"""DecayingEwma and PeakEwma: weighting by elapsed time, peaks, and idle decay to the prior."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.ewma import DecayingEwma, PeakEwma

E = math.exp(-1.0)

latencies = st.floats(0.0, 10.0)
# Mostly forward steps, some simultaneous samples, and a few slightly backward readings.
time_steps = st.one_of(st.floats(0.0, 5.0), st.just(0.0), st.floats(-0.01, 0.0))


# -- DecayingEwma -----------------------------------------------------------------------------


def test_decaying_ewma_starts_at_the_prior_and_the_first_sample_replaces_it() -> None:
    ewma = DecayingEwma(tau_s=1.0, prior=0.3)
    assert ewma.value(now=0.0) == 0.3
    assert ewma.last_sample_at is None
    ewma.observe(2.0, now=5.0)
    assert ewma.value(now=5.0) == 2.0
    assert ewma.last_sample_at == 5.0


def test_decaying_ewma_weights_the_old_estimate_by_elapsed_time() -> None:
    ewma = DecayingEwma(tau_s=2.0, prior=0.0)
    ewma.observe(0.0, now=0.0)
    ewma.observe(1.0, now=2.0)  # one tau later: old estimate keeps e^-1
    assert ewma.value(now=2.0) == pytest.approx(1.0 - E)
    ewma.observe(5.0, now=2.0)  # no time passed: the old estimate keeps all its weight
    assert ewma.value(now=2.0) == pytest.approx(1.0 - E)
    ewma.observe(5.0, now=1.0)  # a backward reading counts as no time passed
    assert ewma.value(now=100.0) == pytest.approx(1.0 - E)  # idleness does not move it
    assert ewma.last_sample_at == 2.0


@given(st.lists(st.tuples(time_steps, latencies), min_size=1, max_size=30), latencies)
def test_decaying_ewma_stays_within_the_samples(
    steps: list[tuple[float, float]], prior: float
) -> None:
    ewma = DecayingEwma(tau_s=1.0, prior=prior)
    now = 0.0
    seen: list[float] = []
    for dt, value in steps:
        now += dt
        ewma.observe(value, now)
        seen.append(value)
        tol = 1e-12 * max(1.0, max(seen))
        assert min(seen) - tol <= ewma.value(now) <= max(seen) + tol


def test_ewma_arguments_are_validated() -> None:
    for cls in (DecayingEwma, PeakEwma):
        for tau in (0.0, -1.0, math.nan, math.inf):
            with pytest.raises(ValueError):
                cls(tau_s=tau, prior=1.0)
        with pytest.raises(ValueError):
            cls(tau_s=1.0, prior=math.nan)
        with pytest.raises(ValueError):
            cls(tau_s=1.0, prior=1.0).observe(math.nan, now=0.0)


# -- PeakEwma ---------------------------------------------------------------------------------


def test_peak_ewma_starts_at_the_prior() -> None:
    peak = PeakEwma(tau_s=1.0, prior=0.05)
    assert peak.estimate(now=123.0) == 0.05
    assert peak.last_sample_at is None


def test_a_slower_sample_is_believed_at_once() -> None:
    peak = PeakEwma(tau_s=10.0, prior=0.05)
    peak.observe(0.05, now=0.0)
    peak.observe(0.04, now=1.0)
    before = peak.estimate(now=1.001)
    peak.observe(0.8, now=1.001)
    assert before < 0.05
    assert peak.estimate(now=1.001) == 0.8


def test_an_idle_estimate_decays_toward_the_prior_not_toward_zero() -> None:
    peak = PeakEwma(tau_s=2.0, prior=0.05)
    peak.observe(0.5, now=0.0)
    assert peak.estimate(now=2.0) == pytest.approx(0.05 + 0.45 * E)
    assert peak.estimate(now=1000.0) == pytest.approx(0.05)
    assert peak.estimate(now=1000.0) >= 0.05
    # And from below: an estimate under the prior rises back to it when idle.
    fast = PeakEwma(tau_s=2.0, prior=0.05)
    fast.observe(0.001, now=0.0)
    assert fast.estimate(now=2.0) == pytest.approx(0.05 - 0.049 * E)
    assert fast.estimate(now=1000.0) == pytest.approx(0.05)


def test_decay_follows_elapsed_time_not_the_number_of_samples() -> None:
    one, many = PeakEwma(tau_s=1.0, prior=0.02), PeakEwma(tau_s=1.0, prior=0.02)
    for p in (one, many):
        p.observe(0.5, now=0.0)
    one.observe(0.01, now=1.0)
    for i in range(1, 101):  # a hundred fast samples spread over the same second
        many.observe(0.01, now=i / 100)
    assert many.estimate(1.0) == pytest.approx(one.estimate(1.0), rel=1e-9)
    assert one.estimate(1.0) == pytest.approx(0.5 * E + 0.01 * (1 - E))
    # A burst at a single instant carries no elapsed time, so it moves nothing.
    burst = PeakEwma(tau_s=1.0, prior=0.02)
    burst.observe(0.5, now=0.0)
    for _ in range(100):
        burst.observe(0.01, now=0.0)
    assert burst.estimate(0.0) == 0.5


def test_a_lower_sample_never_raises_the_estimate() -> None:
    # Blending from the un-relaxed last estimate (100 ms) would give 0.368*100 + 0.632*40 =
    # 62 ms, above both the 43 ms the router saw a moment ago and the 40 ms sample.
    peak = PeakEwma(tau_s=1.0, prior=0.010)
    peak.observe(0.100, now=0.0)
    seen = peak.estimate(now=1.0)
    assert seen == pytest.approx(0.010 + 0.090 * E)
    peak.observe(0.040, now=1.0)
    assert peak.estimate(now=1.0) <= seen


@pytest.mark.parametrize("steady", [0.004, 0.03])
def test_a_steady_latency_is_learned_whichever_side_of_the_prior(steady: float) -> None:
    peak = PeakEwma(tau_s=1.0, prior=0.01)
    peak.observe(0.5, now=0.0)
    for i in range(1, 2001):
        peak.observe(steady, now=i / 100)
    assert peak.estimate(now=20.0) == pytest.approx(steady, rel=1e-6)


def test_backward_time_is_treated_as_no_time() -> None:
    peak = PeakEwma(tau_s=1.0, prior=0.01)
    peak.observe(0.2, now=5.0)
    assert peak.estimate(now=4.0) == 0.2
    peak.observe(0.05, now=4.9)
    assert peak.estimate(now=5.0) == 0.2
    assert peak.last_sample_at == 5.0
    peak.observe(0.3, now=4.9)  # a peak still counts, whenever it is stamped
    assert peak.estimate(now=5.0) == 0.3


def test_set_prior_moves_the_idle_target() -> None:
    peak = PeakEwma(tau_s=1.0, prior=0.01)
    peak.set_prior(0.02)
    assert (peak.prior, peak.estimate(0.0)) == (0.02, 0.02)
    peak.observe(0.5, now=0.0)
    peak.set_prior(0.1)
    assert peak.estimate(now=0.0) == 0.5
    assert peak.estimate(now=1.0) == pytest.approx(0.1 + 0.4 * E)
    assert peak.estimate(now=1000.0) == pytest.approx(0.1)


@given(st.lists(st.tuples(time_steps, latencies), max_size=40), latencies, st.floats(0.01, 10))
def test_estimate_stays_between_the_prior_and_the_samples(
    steps: list[tuple[float, float]], prior: float, tau: float
) -> None:
    peak = PeakEwma(tau_s=tau, prior=prior)
    now = 0.0
    lo = hi = prior
    for dt, value in steps:
        now += dt
        before = peak.estimate(now)
        peak.observe(value, now)
        after = peak.estimate(now)
        lo, hi = min(lo, value), max(hi, value)
        tol = 1e-12 * max(1.0, hi)
        assert lo - tol <= after <= hi + tol
        if value >= before:
            assert after == value  # the peak replaces the estimate
        else:
            assert after <= before + tol  # a lower sample never raises it
        for later in (now + 0.5, now + 3.0, now + 100.0):
            assert lo - tol <= peak.estimate(later) <= hi + tol


@given(latencies, latencies, st.floats(0.01, 10), st.lists(st.floats(0, 50), max_size=10))
def test_idle_decay_is_monotone_toward_the_prior(
    prior: float, sample: float, tau: float, gaps: list[float]
) -> None:
    peak = PeakEwma(tau_s=tau, prior=prior)
    peak.observe(sample, now=0.0)
    previous = sample
    for t in sorted(gaps):
        current = peak.estimate(now=t)
        # Never overshoots the prior and never moves away from it.
        assert min(prior, sample) <= current <= max(prior, sample)
        assert abs(current - prior) <= abs(previous - prior) + 1e-15
        previous = current
