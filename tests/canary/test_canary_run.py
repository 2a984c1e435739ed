"""RolloutRun: windows, streaks, steps, sequential rollback, max duration, terminal states."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import arm, drive, until_decision

from controller.canary import (
    ArmEvidence,
    JudgePolicy,
    RolloutAction,
    RolloutPhase,
    RolloutRun,
)

POLICY = JudgePolicy()


def new_run(**kwargs: object) -> RolloutRun:
    params: dict[str, object] = {"steps": [], "policy": POLICY, "started_at": 0.0}
    params.update(kwargs)
    return RolloutRun(**params)  # type: ignore[arg-type]


def test_a_new_run_sits_at_the_first_step() -> None:
    run = new_run()
    assert run.steps == (1.0, 5.0, 25.0, 50.0)
    assert (run.step_index, run.canary_percent, run.weight_bp) == (0, 1.0, 100)
    assert run.phase is RolloutPhase.PROGRESSING and not run.done
    assert run.tick(5.0) is None  # nothing to decide inside the first window


def test_a_sparse_window_holds_with_the_requests_it_needs_and_touches_no_streak() -> None:
    run = new_run()
    rng = np.random.default_rng(1)
    run.observe(arm(rng, 500), arm(rng, 7), 3.0)
    decision = run.tick(10.0)
    assert decision is not None
    assert (decision.action, decision.reason) == (RolloutAction.HOLD, "insufficient_data")
    assert decision.needed_requests == POLICY.min_requests - 7
    assert decision.canary.requests == 7 and decision.baseline.requests == 500
    assert (run.healthy_streak, run.unhealthy_streak) == (0, 0)
    # The window keeps its evidence: 43 more canary requests make it judgeable.
    assert run.tick(15.0) is None
    run.observe(arm(rng, 500), arm(rng, 43), 16.0)
    decision = run.tick(20.0)
    assert decision is not None and decision.reason == "awaiting_confirmation"
    assert decision.canary.requests == 50
    assert run.healthy_streak == 1


def test_identical_arms_walk_every_step_and_promote() -> None:
    run = new_run()
    decisions = drive(run, np.random.default_rng(7))
    actions = [d.action for _, d in decisions]
    assert actions.count(RolloutAction.ADVANCE) == 3
    assert actions[-1] is RolloutAction.PROMOTE
    assert run.phase is RolloutPhase.PROMOTED and run.done
    assert (run.canary_percent, run.weight_bp) == (100.0, 10000)
    advances = [d for _, d in decisions if d.action is RolloutAction.ADVANCE]
    assert [(d.from_percent, d.to_percent) for d in advances] == [(1, 5), (5, 25), (25, 50)]


def test_a_canary_with_five_more_error_points_is_rolled_back_at_the_first_step() -> None:
    run = new_run()
    decisions = drive(run, np.random.default_rng(3), canary_error_rate=0.052)
    last = decisions[-1][1]
    assert last.action is RolloutAction.ROLLBACK and last.reason == "error_rate"
    assert last.from_percent == 1.0 and last.to_percent == 0.0
    assert run.phase is RolloutPhase.ROLLED_BACK and run.weight_bp == 0


def test_a_slow_canary_is_rolled_back_on_latency() -> None:
    run = new_run()
    decisions = drive(run, np.random.default_rng(4), canary_median_s=0.075)
    last = decisions[-1][1]
    assert last.action is RolloutAction.ROLLBACK
    assert last.reason in {"latency", "latency_rank"}


def test_a_clearly_broken_canary_is_rolled_back_before_its_window_ends() -> None:
    run = new_run()
    rng = np.random.default_rng(5)
    t, decision = until_decision(run, rng, baseline=198, canary=2, canary_error_rate=0.9)
    assert decision.action is RolloutAction.ROLLBACK and decision.reason == "error_rate"
    assert t < POLICY.window_s
    assert decision.statistics["error_log_e"] >= decision.statistics["error_log_bound"]


def test_max_duration_rolls_back_with_a_clear_reason() -> None:
    run = new_run(policy=JudgePolicy(max_duration_s=30.0))
    first = run.tick(29.0)  # a sparse window: a hold, not the end
    assert first is not None and first.reason == "insufficient_data"
    decision = run.tick(30.0)
    assert decision is not None
    assert (decision.action, decision.reason) == (RolloutAction.ROLLBACK, "max_duration")
    assert run.phase is RolloutPhase.ROLLED_BACK


def test_a_finished_run_ignores_evidence_and_decides_nothing() -> None:
    run = new_run(policy=JudgePolicy(max_duration_s=1.0))
    assert run.tick(1.0) is not None
    run.observe(ArmEvidence(10, 0, 0, [0.1] * 10), ArmEvidence(10, 0, 0, [0.1] * 10), 2.0)
    assert run.tick(100.0) is None
    assert run.done and run.weight_bp == 0


def test_resume_at_a_later_step() -> None:
    run = new_run(step_index=2, resumed_at=500.0)
    assert (run.canary_percent, run.weight_bp) == (25.0, 2500)
    assert run.window_started_at == 500.0
    assert run.tick(505.0) is None
    with pytest.raises(ValueError, match="step_index"):
        new_run(step_index=4)


def test_evidence_is_validated() -> None:
    with pytest.raises(ValueError, match="exceed requests"):
        ArmEvidence(requests=3, errors=2, shed=2, latencies_s=())
    with pytest.raises(ValueError, match="answered"):
        ArmEvidence(requests=2, errors=1, shed=0, latencies_s=[0.1, 0.2])
    with pytest.raises(ValueError, match=">= 0"):
        ArmEvidence(requests=-1, errors=0, shed=0, latencies_s=())
    run = new_run()
    with pytest.raises(ValueError, match="finite"):
        run.observe(ArmEvidence(1, 0, 0, [float("nan")]), ArmEvidence.empty(), 1.0)


def test_an_inconclusive_window_holds_and_restarts_the_healthy_streak() -> None:
    run = new_run()
    rng = np.random.default_rng(21)
    run.observe(arm(rng, 3000), arm(rng, 300), 9.0)
    first = run.tick(10.0)
    assert first is not None and first.reason == "awaiting_confirmation"
    assert run.healthy_streak == 1
    canary = arm(rng, 296)
    four_errors = ArmEvidence(300, 4, 0, canary.latencies_s)  # 1.3 %: over 0.7 %, not proof
    run.observe(arm(rng, 3000), four_errors, 19.0)
    second = run.tick(20.0)
    assert second is not None
    assert (second.action, second.reason) == (RolloutAction.HOLD, "inconclusive")
    assert (run.healthy_streak, run.unhealthy_streak) == (0, 0)
    assert run.window_started_at == 20.0


def test_an_advance_starts_a_fresh_window_at_the_next_step() -> None:
    run = new_run(steps=[10, 20])
    rng = np.random.default_rng(2)
    decisions = []
    t = 0.0
    while run.step_index == 0:
        t += 1.0
        run.observe(arm(rng, 180), arm(rng, 20), t)
        decision = run.tick(t)
        if decision is not None:
            decisions.append(decision)
    advance = decisions[-1]
    assert (advance.action, advance.from_percent, advance.to_percent) == (
        RolloutAction.ADVANCE,
        10.0,
        20.0,
    )
    assert advance.baseline.requests > 0 and advance.canary.requests > 0
    assert advance.canary.p95_s > advance.canary.p50_s > 0
    assert run.window_started_at == t and (run.healthy_streak, run.unhealthy_streak) == (0, 0)
    assert run.weight_bp == 2000


def test_a_sequential_rollback_reports_the_evidence_of_the_step() -> None:
    run = new_run()
    rng = np.random.default_rng(8)
    t, decision = until_decision(run, rng, baseline=198, canary=5, canary_error_rate=0.6)
    assert decision.reason == "error_rate"
    assert decision.canary.requests == 5 * int(t)
    assert decision.canary.error_rate > 0.3
    # The first step's share of the budget, of which a run never resumed spends 1 - 0.1.
    assert decision.statistics["alpha"] == pytest.approx(POLICY.false_alarm_rate * 0.75 * 0.9)


def test_time_that_runs_backwards_counts_as_no_time() -> None:
    run = new_run(policy=JudgePolicy(max_duration_s=50.0))
    assert run.tick(30.0) is not None  # a sparse hold
    assert run.tick(10.0) is None  # not a new window, not a reset
    with pytest.raises(ValueError, match="finite"):
        run.tick(float("nan"))
    decision = run.tick(50.0)
    assert decision is not None and decision.reason == "max_duration"


def test_policy_values_are_validated_with_the_field_named() -> None:
    with pytest.raises(ValueError, match=r"policy\.window_s"):
        JudgePolicy(window_s=0)
    with pytest.raises(ValueError, match=r"policy\.max_error_rate_increase"):
        JudgePolicy(max_error_rate_increase=2.0)
    with pytest.raises(ValueError, match=r"policy\.false_alarm_rate"):
        JudgePolicy(false_alarm_rate=0.0)
    with pytest.raises(ValueError, match=r"policy\.min_requests"):
        JudgePolicy(min_requests=0)
