"""judge_window: sparse, healthy, inconclusive and unhealthy windows, and which guard says so."""

from __future__ import annotations

import numpy as np

from controller.canary import ArmEvidence, JudgePolicy
from controller.canary.evidence import ArmAccumulator
from controller.canary.window import Verdict, judge_window

POLICY = JudgePolicy()


def accumulate(requests: int, errors: int, latencies: np.ndarray) -> ArmAccumulator:
    arm = ArmAccumulator(POLICY.max_samples_per_arm)
    arm.add(ArmEvidence(requests, errors, 0, latencies), latencies)
    return arm


def lognormal(seed: int, n: int, median: float = 0.05, sigma: float = 0.4) -> np.ndarray:
    return median * np.exp(np.random.default_rng(seed).normal(0.0, sigma, n))


BASELINE = accumulate(2000, 4, lognormal(1, 1996))


def test_sparse_window_says_how_many_more_requests_it_needs() -> None:
    verdict = judge_window(BASELINE, accumulate(12, 0, lognormal(2, 12)), POLICY)
    assert verdict.verdict is Verdict.SPARSE and verdict.reason == "insufficient_data"
    assert verdict.needed_requests == POLICY.min_requests - 12
    assert "38 more" in verdict.detail


def test_identical_arms_are_healthy() -> None:
    verdict = judge_window(BASELINE, accumulate(200, 0, lognormal(3, 200)), POLICY)
    assert verdict.verdict is Verdict.HEALTHY and verdict.reason == "healthy"
    assert 0.3 < verdict.statistics["common_language"] < 0.7


def test_one_error_in_fifty_is_inconclusive_not_unhealthy() -> None:
    # 2 % against a 0.7 % limit is a breach of the point estimate, but not evidence.
    verdict = judge_window(BASELINE, accumulate(50, 1, lognormal(4, 49)), POLICY)
    assert verdict.verdict is Verdict.INCONCLUSIVE and verdict.reason == "inconclusive"
    assert verdict.statistics["error_p"] > POLICY.window_alpha


def test_a_significant_error_breach_is_unhealthy() -> None:
    verdict = judge_window(BASELINE, accumulate(100, 9, lognormal(5, 91)), POLICY)
    assert verdict.verdict is Verdict.UNHEALTHY and verdict.reason == "error_rate"
    assert verdict.statistics["error_p"] < POLICY.window_alpha


def test_sheds_count_against_the_canary() -> None:
    canary = ArmAccumulator(POLICY.max_samples_per_arm)
    latencies = lognormal(6, 91)
    canary.add(ArmEvidence(100, 0, 9, latencies), latencies)
    assert judge_window(BASELINE, canary, POLICY).reason == "error_rate"


def test_a_slow_tail_is_a_latency_breach() -> None:
    verdict = judge_window(BASELINE, accumulate(400, 0, 1.6 * lognormal(7, 400)), POLICY)
    assert verdict.verdict is Verdict.UNHEALTHY and verdict.reason == "latency"
    assert verdict.statistics["p95_ratio"] > POLICY.max_p95_ratio


def test_a_canary_slower_in_body_but_not_tail_fails_the_rank_test() -> None:
    # Same tail, slower body: p95 within 1.2x, yet a canary request is usually slower.
    rng = np.random.default_rng(8)
    baseline = accumulate(2000, 0, rng.uniform(0.0, 1.0, 2000))
    canary = accumulate(400, 0, rng.uniform(0.25, 1.0, 400))
    verdict = judge_window(baseline, canary, POLICY)
    assert verdict.statistics["p95_ratio"] < POLICY.max_p95_ratio
    assert verdict.verdict is Verdict.UNHEALTHY and verdict.reason == "latency_rank"
    assert verdict.statistics["common_language"] > 0.5 + POLICY.rank_min_effect


def test_a_faster_canary_is_healthy() -> None:
    verdict = judge_window(BASELINE, accumulate(300, 0, 0.6 * lognormal(9, 300)), POLICY)
    assert verdict.verdict is Verdict.HEALTHY
    assert verdict.statistics["common_language"] < 0.5


def test_a_canary_that_answered_nothing_is_judged_on_errors() -> None:
    verdict = judge_window(BASELINE, accumulate(60, 60, np.empty(0)), POLICY)
    assert verdict.verdict is Verdict.UNHEALTHY and verdict.reason == "error_rate"
