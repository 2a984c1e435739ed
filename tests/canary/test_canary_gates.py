"""RolloutRun's gates: pause, approval, analysis-only — on a paused clock, seeded evidence."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from canary_helpers import arm

from controller.canary import (
    ApprovalMode,
    Decision,
    Gates,
    JudgePolicy,
    NotAwaitingApproval,
    RolloutAction,
    RolloutPhase,
    RolloutRun,
)

POLICY = JudgePolicy(window_s=10.0, max_duration_s=600.0)


def feed(
    run: RolloutRun,
    rng: np.random.Generator,
    start: float,
    seconds: int,
    *,
    canary_error_rate: float = 0.002,
) -> list[Decision]:
    """One second of healthy-baseline traffic per tick (200 req/s, split by the share)."""
    out = []
    for t in range(int(start) + 1, int(start) + seconds + 1):
        share = run.canary_percent / 100.0
        run.observe(
            arm(rng, int(200 * (1 - share)), error_rate=0.002),
            arm(rng, max(1, int(200 * share)), error_rate=canary_error_rate),
            float(t),
        )
        decision = run.tick(float(t))
        if decision is not None:
            out.append(decision)
        if run.done:
            break
    return out


def new_run(gates: Gates, steps: tuple[float, ...] = (25.0, 50.0)) -> RolloutRun:
    return RolloutRun(steps=steps, policy=POLICY, started_at=0.0, gates=gates)


def test_a_paused_run_keeps_judging_but_never_moves() -> None:
    run = new_run(Gates(paused=True))
    decisions = feed(run, np.random.default_rng(1), 0, 200)
    assert decisions and all(d.action is RolloutAction.HOLD for d in decisions)
    assert "paused" in {d.reason for d in decisions}
    assert (run.step_index, run.weight_bp) == (0, 2500)
    # Resumed: the first healthy window after it advances (the streak was kept).
    run.set_gates(Gates(paused=False), 200.0)
    after = feed(run, np.random.default_rng(2), 200, 10)
    assert after[-1].action is RolloutAction.ADVANCE and run.step_index == 1


def test_pausing_does_not_spend_the_rollouts_time_limit() -> None:
    run = new_run(Gates(paused=True))
    feed(run, np.random.default_rng(3), 0, 900)  # longer than max_duration, but held
    assert not run.done
    run.set_gates(Gates(), 900.0)
    after = feed(run, np.random.default_rng(4), 900, 30)
    assert "max_duration" not in {d.reason for d in after}  # the 900 s held do not count
    assert RolloutAction.ADVANCE in {d.action for d in after}


def test_a_regression_still_rolls_back_while_paused_unless_auto_rollback_is_off() -> None:
    run = new_run(Gates(paused=True))
    decisions = feed(run, np.random.default_rng(4), 0, 300, canary_error_rate=0.2)
    assert (decisions[-1].action, decisions[-1].reason) == (RolloutAction.ROLLBACK, "error_rate")

    held = new_run(Gates(paused=True, auto_rollback=False))
    decisions = feed(held, np.random.default_rng(4), 0, 300, canary_error_rate=0.2)
    assert not held.done
    reasons = [d.reason for d in decisions]
    assert reasons.count("rollback_held") == 1  # announced once, not every tick
    assert all(d.action is RolloutAction.HOLD for d in decisions)
    held.set_gates(Gates(paused=False), 300.0)
    after = feed(held, np.random.default_rng(5), 300, 5, canary_error_rate=0.2)
    assert after[-1].action is RolloutAction.ROLLBACK  # acted on once resumed


@pytest.mark.parametrize("mode", [ApprovalMode.PROMOTION, ApprovalMode.EVERY_STEP])
def test_approval_stops_before_the_moves_it_covers(mode: ApprovalMode) -> None:
    run = new_run(Gates(approval=mode))
    rng = np.random.default_rng(6)
    with pytest.raises(NotAwaitingApproval, match="not awaiting approval"):
        run.approve(0.0)
    decisions = feed(run, rng, 0, 120)
    if mode is ApprovalMode.EVERY_STEP:
        assert run.awaiting_approval and run.step_index == 0
        assert decisions[-1].reason == "awaiting_approval"
        assert [d.reason for d in decisions].count("awaiting_approval") == 1
        step = run.approve(120.0)
        assert (step.action, step.reason, step.to_percent) == (
            RolloutAction.ADVANCE,
            "approved",
            50.0,
        )
        decisions = feed(run, rng, 120, 120)
    assert run.awaiting_approval and run.step_index == 1 and not run.done
    assert decisions[-1].reason == "awaiting_approval"
    promote = run.approve(300.0)
    assert (promote.action, promote.reason) == (RolloutAction.PROMOTE, "approved")
    assert run.phase is RolloutPhase.PROMOTED and not run.awaiting_approval


def test_an_approval_survives_a_restart() -> None:
    resumed = RolloutRun(
        steps=(25.0, 50.0),
        policy=POLICY,
        started_at=0.0,
        step_index=1,
        resumed_at=500.0,
        gates=Gates(approval=ApprovalMode.PROMOTION),
        awaiting_approval=True,
        resumes_in_step=1,
    )
    assert resumed.awaiting_approval and resumed.resumes_in_step == 1
    assert resumed.approve(501.0).action is RolloutAction.PROMOTE


def test_analysis_only_records_every_move_and_routes_only_the_first_step() -> None:
    run = new_run(Gates(analysis_only=True), steps=(10.0, 25.0, 50.0))
    weights = []
    decisions = []
    rng = np.random.default_rng(7)
    for t in range(1, 400):
        weights.append(run.weight_bp)
        share = run.steps[0] / 100.0  # traffic really stays at the first step
        run.observe(arm(rng, int(200 * (1 - share))), arm(rng, int(200 * share)), float(t))
        decision = run.tick(float(t))
        if decision is not None:
            decisions.append(decision)
        if run.done:
            break
    assert set(weights) == {1000}
    moves = [d for d in decisions if d.action is not RolloutAction.HOLD]
    assert [d.action for d in moves] == [RolloutAction.ADVANCE] * 2 + [RolloutAction.PROMOTE]
    assert not any(d.applied for d in moves)
    assert all(d.applied for d in decisions if d.action is RolloutAction.HOLD)
    assert run.done and run.weight_bp == 0  # the analysis ends with no canary traffic


def test_a_resumed_step_never_gets_a_fresh_false_alarm_budget() -> None:
    from controller.canary.sequential import segment_alpha

    budget = 0.0075
    runs = [segment_alpha(budget, k) for k in range(30)]
    assert sum(runs) == pytest.approx(budget)
    assert all(later < earlier for earlier, later in itertools.pairwise(runs))
    first = RolloutRun(steps=(5.0, 50.0), policy=POLICY, started_at=0.0)
    again = RolloutRun(
        steps=(5.0, 50.0), policy=POLICY, started_at=0.0, resumed_at=30.0, resumes_in_step=1
    )
    assert first._tests.alpha == pytest.approx(segment_alpha(0.0075, 0))
    assert again._tests.alpha == pytest.approx(segment_alpha(0.0075, 1))
    with pytest.raises(ValueError, match="resumes_in_step"):
        RolloutRun(steps=(5.0,), policy=POLICY, started_at=0.0, resumes_in_step=-1)
