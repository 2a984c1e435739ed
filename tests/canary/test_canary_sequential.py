"""SequentialTests: fast on clear breaches, quiet within tolerance, budgets that add up."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import arm

from controller.canary import ArmEvidence, JudgePolicy
from controller.canary.sequential import SequentialTests, step_alpha

POLICY = JudgePolicy()


def requests_to_breach(
    seed: int,
    *,
    canary_error_rate: float = 0.002,
    canary_median_s: float = 0.05,
    alpha: float = 0.005,
    limit: int = 3000,
    per_tick: int = 2,
) -> tuple[int, str | None]:
    rng = np.random.default_rng(seed)
    tests = SequentialTests(POLICY, alpha)
    served = 0
    now = 0.0
    while served < limit:
        now += 1.0
        base = arm(rng, 198, error_rate=0.002)
        canary = arm(rng, per_tick, error_rate=canary_error_rate, median_s=canary_median_s)
        served += canary.requests
        observe(tests, base, canary, now)
        breach = tests.check()
        if breach is not None:
            return served, breach.reason
    return served, None


def observe(tests: SequentialTests, base: ArmEvidence, canary: ArmEvidence, now: float) -> None:
    tests.observe(base, canary, np.asarray(base.latencies_s), np.asarray(canary.latencies_s), now)


def test_step_budgets_sum_to_the_false_alarm_rate() -> None:
    for steps in (1, 2, 4, 7):
        total = sum(step_alpha(0.01, i, steps) for i in range(steps))
        assert total == pytest.approx(0.01)
    assert step_alpha(0.01, 0, 4) == pytest.approx(0.0075)  # the first step gets the most
    assert step_alpha(0.01, 3, 4) == pytest.approx(0.0025 / 3)  # the rest share the remainder
    assert step_alpha(0.01, 0, 1) == pytest.approx(0.01)


def test_five_more_error_points_are_proven_in_a_few_hundred_canary_requests() -> None:
    served = [requests_to_breach(seed, canary_error_rate=0.052) for seed in range(20)]
    assert all(reason == "error_rate" for _, reason in served)
    assert np.median([n for n, _ in served]) < 300


def test_a_one_and_a_half_times_slower_canary_is_proven_on_latency() -> None:
    served = [requests_to_breach(seed, canary_median_s=0.075) for seed in range(10)]
    assert all(reason in {"latency", "latency_rank"} for _, reason in served)
    assert np.median([n for n, _ in served]) < 300


def test_an_identical_canary_is_not_flagged() -> None:
    flagged = [requests_to_breach(seed, limit=1500, per_tick=20)[1] for seed in range(40)]
    assert flagged.count(None) == 40


def test_a_canary_within_the_error_tolerance_is_not_flagged() -> None:
    # +0.3 points against a +0.5 point tolerance: worse, but within what the policy allows.
    flagged = [
        requests_to_breach(seed, canary_error_rate=0.005, limit=4000, per_tick=40)[1]
        for seed in range(30)
    ]
    assert flagged.count(None) == 30


def test_latency_tests_wait_for_a_large_enough_baseline_sample() -> None:
    rng = np.random.default_rng(1)
    tests = SequentialTests(POLICY, 0.005)
    base = arm(rng, 100)
    for now in range(1, 25):
        observe(tests, base if now == 1 else arm(rng, 0), arm(rng, 20, median_s=0.5), now)
    assert tests.check() is None  # 100 baseline latencies are too few to rank against
    for now in range(25, 31):
        observe(tests, arm(rng, 100), arm(rng, 0), now)
    breach = tests.check()
    assert breach is not None and breach.reason in {"latency", "latency_rank"}
