"""The rollout simulation: same traffic for every judge, the real judge inside, the report."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from bench import cli
from bench.rollout_judge_registry import JUDGES, make_judge
from bench.rollout_judges import FixedIntervalJudge, OriginalJudge
from bench.rollout_sim import SimConfig, describe, format_table, run_rollouts, simulate
from bench.rollout_traffic import CASES, Traffic, TrafficModel, error_case
from controller.canary import (
    ArmEvidence,
    JudgePolicy,
    RolloutAction,
    RolloutPhase,
    RolloutRun,
)

CASE = {case.name: case for case in CASES}
KEYS = {
    "judge", "case", "seeds", "promoted", "rolled_back", "decision_s_p50", "decision_s_p95",
    "blast_radius_p50", "blast_radius_p95", "blast_radius_mean", "rollback_reasons",
    "rollback_percent",
}  # fmt: skip


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_the_halcyon_judge_is_the_controllers_rollout_run() -> None:
    judge = make_judge("halcyon", (1, 5), JudgePolicy(), 0.0)
    assert type(judge) is RolloutRun  # the real judge, not a copy
    assert [j.name for j in JUDGES] == ["halcyon", "original", "fixed-interval", "flagger", "argo"]
    with pytest.raises(ValueError, match="unknown judge"):
        make_judge("oracle", (1,), JudgePolicy(), 0.0)


def test_assignment_is_sticky_and_shared_by_every_judge() -> None:
    traffic = Traffic(TrafficModel(), 7)
    low_b, low_c = traffic.evidence(CASE["aa"], 3, 0.05)
    high_b, high_c = traffic.evidence(CASE["aa"], 3, 0.25)
    # Raising the share moves requests from baseline to canary and nothing else.
    assert low_b.requests + low_c.requests == high_b.requests + high_c.requests
    assert high_c.requests >= low_c.requests
    assert set(np.asarray(low_c.latencies_s)) <= set(np.asarray(high_c.latencies_s))
    # Same (case, second, share): the very same evidence for whoever asks, and reproducible.
    assert traffic.evidence(CASE["aa"], 3, 0.05) == (low_b, low_c)
    again = Traffic(TrafficModel(), 7).evidence(CASE["aa"], 3, 0.05)
    assert np.array_equal(np.asarray(again[1].latencies_s), np.asarray(low_c.latencies_s))


def test_cases_change_only_the_canary() -> None:
    traffic = Traffic(TrafficModel(rate=2000), 3)
    base_aa, canary_aa = traffic.evidence(CASE["aa"], 0, 0.5)
    base_err, canary_err = traffic.evidence(CASE["errors"], 0, 0.5)
    base_slow, canary_slow = traffic.evidence(CASE["slow"], 0, 0.5)
    assert base_aa.requests == base_err.requests == base_slow.requests
    assert np.array_equal(np.asarray(base_aa.latencies_s), np.asarray(base_slow.latencies_s))
    assert canary_err.errors > canary_aa.errors + 20
    assert np.allclose(np.asarray(canary_slow.latencies_s), 1.5 * np.asarray(canary_aa.latencies_s))


def test_the_underprovisioned_canary_loads_up_as_it_is_ramped() -> None:
    traffic = Traffic(TrafficModel(), 1)
    case = CASE["underprovisioned"]
    rho = {share: traffic.utilisations(case, share) for share in (0.01, 0.25, 1 / 3, 0.5)}
    assert rho[0.01][1] < rho[0.01][0]  # at 1 % the lone canary replica is nearly idle
    assert rho[1 / 3][0] == pytest.approx(rho[1 / 3][1])  # one replica in three: balanced
    assert rho[0.5][1] > rho[0.5][0]  # at 50 % it carries twice a baseline replica's load
    assert traffic.utilisations(CASE["aa"], 0.5) == (0.5, 0.5)


def test_fixed_interval_advances_on_each_passed_check_and_rolls_back_after_five_failures() -> None:
    policy = JudgePolicy()
    judge = FixedIntervalJudge((1, 5), policy, 0.0)
    good = ArmEvidence(100, 0, 0, [0.05] * 100)
    bad = ArmEvidence(100, 50, 0, [0.05] * 50)
    for t in range(1, 61):
        judge.observe(good, good, float(t))
        decision = judge.tick(float(t))
    assert decision is not None and decision.action is RolloutAction.ADVANCE
    actions = []
    for t in range(61, 61 + 5 * 60):
        judge.observe(good, bad, float(t))
        decision = judge.tick(float(t))
        if decision is not None:
            actions.append(decision.action)
    assert actions == [RolloutAction.HOLD] * 4 + [RolloutAction.ROLLBACK]


def test_original_discards_sparse_windows_and_needs_two_in_a_row() -> None:
    judge = OriginalJudge((50,), JudgePolicy(), 0.0)
    sparse = ArmEvidence(1, 0, 0, [0.05])  # 10 a window: fewer than its 20
    plenty = ArmEvidence(100, 0, 0, [0.05] * 100)
    reasons = []
    for t, canary in enumerate([sparse] * 10 + [plenty] * 20, start=1):
        judge.observe(plenty, canary, float(t))
        decision = judge.tick(float(t))
        if decision is not None:
            reasons.append(decision.reason)
    assert reasons == ["insufficient_data", "awaiting_confirmation", "healthy"]
    assert judge.phase is RolloutPhase.PROMOTED


def test_every_judge_ends_every_case_with_a_decision() -> None:
    config = SimConfig(seeds=1, policy=JudgePolicy(max_duration_s=300.0))
    traffic = Traffic(config.traffic, 11)
    for judge in JUDGES:
        for case in CASES:
            result = simulate(judge.name, case, traffic, config)
            assert result.phase in (RolloutPhase.PROMOTED, RolloutPhase.ROLLED_BACK)
            assert 0 < result.decision_s <= 300.0
            assert result.canary_requests > 0


def test_records_have_one_row_per_judge_and_case() -> None:
    config = SimConfig(seeds=3, first_seed=0xC0FFEE, evidence=("independent",))
    records = [r.as_json() for r in run_rollouts(config)]
    assert len(records) == len(JUDGES) * len(CASES)
    assert {(r["judge"], r["case"]) for r in records} == {
        (j.name, c.name) for j in JUDGES for c in CASES
    }
    for r in records:
        assert set(r) == KEYS and r["seeds"] == 3
        assert 0.0 <= r["rolled_back"] <= 1.0 and 0.0 <= r["promoted"] <= 1.0
        assert r["promoted"] + r["rolled_back"] == pytest.approx(1.0)
        assert r["decision_s_p50"] <= r["decision_s_p95"]
        assert r["blast_radius_p50"] <= r["blast_radius_p95"]
    halcyon = {r["case"]: r for r in records if r["judge"] == "halcyon"}
    assert halcyon["errors"]["rolled_back"] == 1.0  # robust: +5 points is never promoted
    assert halcyon["slow"]["rolled_back"] == 1.0
    assert halcyon["faster"]["promoted"] == 1.0


def test_a_promoted_bad_canary_is_charged_the_rest_of_the_horizon() -> None:
    config = SimConfig(seeds=1, policy=JudgePolicy(max_duration_s=600.0))
    traffic = Traffic(config.traffic, 5)
    quiet = error_case(0.01, "barely")  # bad, but far below every judge's tolerance
    result = simulate("fixed-interval", quiet, traffic, config)
    assert result.phase is RolloutPhase.PROMOTED
    left = 600 - int(result.decision_s)
    assert result.blast_radius == result.canary_requests + round(config.traffic.rate * left)
    good = simulate("fixed-interval", CASE["aa"], traffic, config)
    assert good.blast_radius == good.canary_requests  # only a bad canary is charged


def test_the_same_seeds_give_the_same_report() -> None:
    config = SimConfig(seeds=2, first_seed=5)
    first = run_rollouts(config, judges=["halcyon"], cases=["errors"])
    second = run_rollouts(config, judges=["halcyon"], cases=["errors"])
    assert first == second


def test_table_names_its_inputs() -> None:
    config = SimConfig(seeds=1, evidence=("independent",))
    records = run_rollouts(config, judges=["original"], cases=["aa"])
    assert format_table(records).count("\n") == 2
    text = describe(config)
    assert text.startswith("Rollout simulation — 1 seeds from 0x1; 200 req/s")
    assert "evidence independent" in text


def test_rollout_flags_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse("--scenario", "rollout", "--seeds", "0")
    with pytest.raises(SystemExit):
        parse("--scenario", "rollout", "--rollout-rate", "-5")
    args = parse("--scenario", "rollout", "--rollout-rate", "400", "--seeds", "7")
    assert (args.rollout_rate, args.seeds) == (400.0, 7)


def test_extra_error_cases_are_added_by_flag_and_judged_by_every_judge() -> None:
    args = parse("--scenario", "rollout", "--extra-error-points", "10,20")
    assert args.extra_error_points == (10.0, 20.0)
    config = SimConfig(
        seeds=2, cases=(error_case(10.0), error_case(20.0)), evidence=("independent",)
    )
    records = run_rollouts(config)
    assert {(r.judge, r.case) for r in records} == {
        (j.name, c) for j in JUDGES for c in ("errors+10", "errors+20")
    }
    halcyon = {r.case: r for r in records if r.judge == "halcyon"}
    assert halcyon["errors+10"].rolled_back == 1.0
    # A larger regression is proven with fewer requests.
    assert halcyon["errors+20"].blast_radius_p50 < halcyon["errors+10"].blast_radius_p50


@pytest.mark.parametrize("bad", ["0", "-1", "x", "100", ""])
def test_extra_error_points_must_be_increases_between_0_and_99(bad: str) -> None:
    with pytest.raises(SystemExit):
        parse("--scenario", "rollout", "--extra-error-points", bad)
