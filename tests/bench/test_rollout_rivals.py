"""Flagger and Argo Rollouts as their documentation describes them, on hand-made evidence."""

from __future__ import annotations

import pytest

from bench.rollout_judge_registry import make_judge
from bench.rollout_judges import JudgeSetting
from bench.rollout_rivals import (
    ArgoJudge,
    ArgoSettings,
    FlaggerJudge,
    FlaggerSettings,
    argo_settings,
    flagger_settings,
)
from controller.canary import ArmEvidence, Decision, JudgePolicy, RolloutAction, RolloutPhase

POLICY = JudgePolicy(max_duration_s=900.0)
BASELINE = ArmEvidence(100, 0, 0, [0.05] * 100)
GOOD = ArmEvidence(100, 0, 0, [0.05] * 100)
SLOW = ArmEvidence(100, 0, 0, [0.05] * 98 + [0.6] * 2)  # p99 600 ms, relative p95 fine
FAILING = ArmEvidence(100, 2, 0, [0.05] * 98)  # success rate 98 % < 99 %
EMPTY = ArmEvidence(0)


def drive(
    judge: FlaggerJudge | ArgoJudge, canary: list[ArmEvidence], start: int = 1
) -> list[Decision]:
    """Feeds one second of evidence per entry; returns every decision taken."""
    decisions = []
    for t, evidence in enumerate(canary, start=start):
        judge.observe(BASELINE, evidence, float(t))
        decision = judge.tick(float(t))
        if decision is not None:
            decisions.append(decision)
    return decisions


def test_flagger_defaults_are_the_documented_ones() -> None:
    s = FlaggerSettings()
    assert (s.interval_s, s.threshold, s.min_success_rate, s.max_p99_s) == (60.0, 5, 0.99, 0.5)
    assert s.steps == (10.0, 20.0, 30.0, 40.0, 50.0)
    assert make_judge("flagger", (1, 5), POLICY, 0.0).canary_percent == 10.0  # its own steps
    assert flagger_settings(JudgeSetting("flagger", (("threshold", 2.0),))).threshold == 2
    with pytest.raises(ValueError, match="no setting"):
        flagger_settings(JudgeSetting("flagger", (("window_s", 2.0),)))


def test_flagger_fails_a_check_on_the_absolute_p99_alone() -> None:
    judge = FlaggerJudge(FlaggerSettings(), POLICY, 0.0)
    (decision,) = drive(judge, [SLOW] * 60)
    assert (decision.action, decision.reason) == (RolloutAction.HOLD, "latency")
    assert judge.failed_checks == 1 and judge.canary_percent == 10.0
    (decision,) = drive(judge, [FAILING] * 60, start=61)
    assert decision.reason == "error_rate" and judge.failed_checks == 2


def test_flagger_rolls_back_on_the_check_after_threshold_failures_never_reset() -> None:
    judge = FlaggerJudge(FlaggerSettings(threshold=3), POLICY, 0.0)
    # fail, pass, fail, fail: failedChecks is 3 (a pass does not reset it) ...
    evidence = [SLOW] * 60 + [GOOD] * 60 + [SLOW] * 120
    actions = [d.action for d in drive(judge, evidence)]
    assert actions == [RolloutAction.HOLD, RolloutAction.ADVANCE] + [RolloutAction.HOLD] * 2
    assert judge.failed_checks == 3 and judge.canary_percent == 20.0
    # ... and the next run rolls back without looking at its (healthy) interval.
    (decision,) = drive(judge, [GOOD] * 60, start=241)
    assert (decision.action, decision.reason) == (RolloutAction.ROLLBACK, "latency")
    assert judge.phase is RolloutPhase.ROLLED_BACK


def test_flagger_no_data_is_a_failed_check_and_a_pass_at_max_weight_promotes() -> None:
    judge = FlaggerJudge(FlaggerSettings(), POLICY, 0.0)
    (decision,) = drive(judge, [EMPTY] * 60)
    assert decision.reason == "no_data" and judge.failed_checks == 1
    decisions = drive(judge, [GOOD] * 300, start=61)
    assert [d.to_percent for d in decisions] == [20.0, 30.0, 40.0, 50.0, 100.0]
    assert decisions[-1].action is RolloutAction.PROMOTE and decisions[-1].from_percent == 50.0


def test_argo_defaults_are_the_docs_background_example_scaled_to_the_horizon() -> None:
    s = ArgoSettings()
    assert s.weights == (20.0, 40.0, 60.0, 80.0) and s.pause_s == 120.0  # 10 min / 5
    assert (s.interval_s, s.failure_limit, s.count) == (60.0, 3, 0)  # 5 min / 5
    assert argo_settings(JudgeSetting("argo", (("failure_limit", 0.0),))).failure_limit == 0


def test_argo_promotes_after_the_last_pause_with_a_clean_analysis() -> None:
    judge = ArgoJudge(ArgoSettings(), POLICY, 0.0)
    decisions = drive(judge, [GOOD] * 480)
    moves = [d for d in decisions if d.action is not RolloutAction.HOLD]
    assert [(d.action, d.to_percent) for d in moves] == [
        (RolloutAction.ADVANCE, 40.0),
        (RolloutAction.ADVANCE, 60.0),
        (RolloutAction.ADVANCE, 80.0),
        (RolloutAction.PROMOTE, 100.0),
    ]
    assert [d.to_percent for d in moves] and judge.phase is RolloutPhase.PROMOTED
    assert judge.measurements == 8


def test_argo_aborts_when_failures_exceed_the_failure_limit() -> None:
    judge = ArgoJudge(ArgoSettings(failure_limit=2, pause_s=600.0), POLICY, 0.0)
    # Two failed measurements are tolerated (failed > failureLimit aborts), the third aborts.
    decisions = drive(judge, [FAILING] * 180)
    assert [d.action for d in decisions if d.reason == "error_rate"] == [
        RolloutAction.HOLD,
        RolloutAction.HOLD,
        RolloutAction.ROLLBACK,
    ]
    assert judge.phase is RolloutPhase.ROLLED_BACK and decisions[-1].canary.requests == 6000
    zero = ArgoJudge(ArgoSettings(failure_limit=0), POLICY, 0.0)
    (decision,) = drive(zero, [SLOW] * 60)
    assert (decision.action, decision.reason) == (RolloutAction.ROLLBACK, "latency")


def test_argo_counts_each_metric_apart_and_stops_measuring_after_count() -> None:
    judge = ArgoJudge(ArgoSettings(failure_limit=1), POLICY, 0.0)
    drive(judge, [SLOW] * 60 + [FAILING] * 60)  # one failure on each metric: none exceeds 1
    assert judge.failed == {"error_rate": 1, "latency": 1} and not judge.done
    counted = ArgoJudge(ArgoSettings(failure_limit=0, count=1), POLICY, 0.0)
    drive(counted, [GOOD] * 60 + [FAILING] * 420)  # the analysis ended after one measurement
    assert counted.phase is RolloutPhase.PROMOTED and counted.measurements == 1


def test_argo_empty_intervals_are_errors_not_failures() -> None:
    judge = ArgoJudge(ArgoSettings(failure_limit=0, pause_s=900.0), POLICY, 0.0)
    decisions = drive(judge, [EMPTY] * 240)
    assert [(d.action, d.reason) for d in decisions] == [(RolloutAction.HOLD, "no_data")] * 4
    assert judge.failed == {"error_rate": 0, "latency": 0}
    # A 5th error in a row is past the consecutive-error limit (4): the analysis errors out.
    (decision,) = drive(judge, [EMPTY] * 60, start=241)
    assert (decision.action, decision.reason) == (RolloutAction.ROLLBACK, "no_data")
