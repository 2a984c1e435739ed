"""The statistics behind the judge: rank test, tail bounds, e-values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.canary.evidence import DecimatingSample
from controller.canary.stats import (
    BettingEProcess,
    binomial_tail_bound,
    log_mean_exp,
    odds_log_evidence,
    odds_log_evidence_at,
    rank_test,
    sorted_quantile,
)


def brute_force_u(canary: list[float], baseline: list[float]) -> float:
    return sum((c > b) + 0.5 * (c == b) for c in canary for b in baseline)


def test_rank_test_counts_pairs_like_the_definition() -> None:
    result = rank_test(np.array([3.0, 4.0, 5.0]), np.array([1.0, 2.0]))
    assert result is not None
    assert result.u == 6.0 and result.common_language == 1.0 and result.rank_biserial == 1.0
    tied = rank_test(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    assert tied is not None and tied.common_language == 0.5
    assert rank_test(np.array([]), np.array([1.0])) is None
    same = rank_test(np.full(5, 2.0), np.full(7, 2.0))  # all tied: no evidence, no crash
    assert same is not None and same.z == 0.0 and same.p_slower == 0.5


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=30),
    st.lists(st.integers(0, 20), min_size=1, max_size=30),
)
def test_rank_test_u_matches_brute_force_with_ties(canary: list[int], baseline: list[int]) -> None:
    result = rank_test(np.array(canary, dtype=float), np.array(baseline, dtype=float))
    assert result is not None
    assert result.u == pytest.approx(brute_force_u([*map(float, canary)], [*map(float, baseline)]))
    assert 0.0 <= result.p_slower <= 1.0


def test_rank_test_p_value_is_calibrated_on_identical_distributions() -> None:
    rng = np.random.default_rng(11)
    p_values = [
        rank_test(rng.lognormal(0, 0.5, 60), rng.lognormal(0, 0.5, 900)).p_slower  # type: ignore[union-attr]
        for _ in range(2000)
    ]
    assert abs(np.mean(np.array(p_values) < 0.05) - 0.05) < 0.015
    assert abs(np.mean(np.array(p_values) < 0.01) - 0.01) < 0.008


def exact_tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))


@pytest.mark.parametrize("n", [10, 50, 200])
@pytest.mark.parametrize("p", [0.002, 0.012, 0.05, 0.3])
def test_binomial_tail_bound_never_understates_the_exact_tail(n: int, p: float) -> None:
    for k in range(n + 1):
        assert binomial_tail_bound(k, n, p) >= exact_tail(k, n, p) - 1e-12


def test_binomial_tail_bound_edges() -> None:
    assert binomial_tail_bound(0, 0, 0.1) == 1.0
    assert binomial_tail_bound(1, 100, 0.05) == 1.0  # below the mean: no evidence
    assert binomial_tail_bound(3, 10, 0.0) == 0.0


def test_odds_evidence_has_expectation_at_most_one_per_trial_under_the_null() -> None:
    # One trial: E[e] = p e(1) + (1 - p) e(0) for the mixture over the odds ratios.
    for rate in (0.001, 0.01, 0.05, 0.3):
        for p in (0.0, rate / 2, rate):
            expected = p * math.exp(odds_log_evidence(1, 1, rate)) + (1 - p) * math.exp(
                odds_log_evidence(0, 1, rate)
            )
            assert expected <= 1.0 + 1e-12
        # ... and more than one when the true rate is above the null's.
        worse = 3 * rate
        expected = worse * math.exp(odds_log_evidence(1, 1, rate)) + (1 - worse) * math.exp(
            odds_log_evidence(0, 1, rate)
        )
        assert expected > 1.0


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 400), st.integers(1, 400), st.floats(0.001, 0.4), st.floats(0.001, 0.4))
def test_odds_evidence_falls_as_the_tolerated_rate_rises(
    failures: int, extra: int, low: float, high: float
) -> None:
    trials = failures + extra
    low, high = min(low, high), max(low, high)
    assert odds_log_evidence(failures, trials, high) <= odds_log_evidence(failures, trials, low)


def test_odds_evidence_edges() -> None:
    assert odds_log_evidence(0, 0, 0.1) == 0.0
    assert odds_log_evidence(1, 5, 0.0) == math.inf
    assert odds_log_evidence(1, 5, 1.0) < 0.0  # nothing exceeds a 100 % limit


def test_a_clearly_higher_rate_is_proven_in_a_few_hundred_trials() -> None:
    # 5.2 % observed against a tolerated 0.7 %: proven at 1/α = 1000 well before 200 trials.
    assert odds_log_evidence(8, 150, 0.007) > math.log(1000)
    assert odds_log_evidence(1, 150, 0.007) < 0.0


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 300),
    st.integers(1, 300),
    st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=8),
)
def test_odds_evidence_at_many_rates_matches_one_at_a_time(
    failures: int, extra: int, rates: list[float]
) -> None:
    trials = failures + extra
    many = odds_log_evidence_at(failures, trials, np.array(rates))
    one = [odds_log_evidence(failures, trials, rate) for rate in rates]
    assert many == pytest.approx(one, rel=1e-9, abs=1e-9)


def test_log_mean_exp_mixes_without_overflow() -> None:
    logs = np.array([[1000.0, 0.0], [1000.0 + math.log(3.0), math.log(3.0)]])
    assert log_mean_exp(logs) == pytest.approx([1000.0 + math.log(2.0), math.log(2.0)])


def test_betting_e_process_stays_small_under_the_null_and_grows_against_it() -> None:
    rng = np.random.default_rng(3)
    crossed = 0
    for _ in range(300):
        test = BettingEProcess(0.55)
        for _ in range(20):
            test.update(rng.random(50))  # mean 0.5 <= 0.55
            if test.log_e_value >= math.log(20):
                crossed += 1
                break
    assert crossed / 300 <= 0.05
    slow = BettingEProcess(0.55)
    slow.update(np.clip(rng.normal(0.7, 0.25, 300), 0, 1))
    assert slow.log_e_value > math.log(1000)
    assert slow.mean == pytest.approx(0.7, abs=0.05)
    with pytest.raises(ValueError):
        BettingEProcess(1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=50), st.floats(0, 1))
def test_sorted_quantile_matches_numpy(values: list[float], q: float) -> None:
    ordered = np.sort(np.array(values))
    assert sorted_quantile(ordered, q) == pytest.approx(float(np.quantile(ordered, q)))
    assert math.isnan(sorted_quantile(np.empty(0), 0.5))


def test_decimating_sample_is_bounded_sorted_and_keeps_quantiles() -> None:
    rng = np.random.default_rng(9)
    sample = DecimatingSample(512)
    everything = []
    for _ in range(300):
        batch = rng.lognormal(0, 0.6, int(rng.integers(0, 200)))
        everything.append(batch)
        sample.add(batch)
        assert len(sample) <= 512
    values = sample.values()
    assert np.all(np.diff(values) >= 0)
    assert sample.seen == sum(b.size for b in everything)
    exact = np.concatenate(everything)
    for q in (0.5, 0.95):
        assert sorted_quantile(values, q) == pytest.approx(np.quantile(exact, q), rel=0.06)


def test_decimating_sample_is_deterministic_and_keeps_small_streams_whole() -> None:
    small = DecimatingSample(64)
    small.add(np.array([3.0, 1.0, 2.0]))
    assert small.values().tolist() == [1.0, 2.0, 3.0]
    a, b = DecimatingSample(32), DecimatingSample(32)
    for chunk in np.array_split(np.arange(1000, dtype=float)[::-1], 17):
        a.add(chunk)
        b.add(chunk)
    assert a.values().tolist() == b.values().tolist()
    with pytest.raises(ValueError):
        DecimatingSample(1)
