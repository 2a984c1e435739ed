"""One rollout's pure state machine: walk the steps, judge each one, end with a clear outcome.

What it decides: when the canary's traffic share moves and when the rollout ends. The shell
(the controller) calls :meth:`RolloutRun.observe` with each arm's *new* evidence as outcome
reports arrive, and :meth:`RolloutRun.tick` about once a second; it stores every returned
:class:`~controller.canary.model.Decision` and pushes :attr:`RolloutRun.weight_bp` to the
gateways. Time is whatever float seconds the caller passes (``started_at`` and every ``now`` on
one timeline); nothing here reads a clock.

On every tick, in order:

1. **Maximum duration.** A rollout older than ``max_duration_s`` is rolled back with reason
   ``max_duration``: a rollout that could not prove the canary healthy in that time has not
   earned promotion, and rolling back is the outcome that needs no further evidence.
2. **Sequential tests** (:mod:`controller.canary.sequential`) over the evidence of the current
   step: the moment a guard's breach is proven, ROLLBACK — whatever the window. They are the
   only way a canary is judged *bad*, so their false-alarm budget is the rollout's: the steps
   share ``false_alarm_rate`` (:func:`~controller.canary.sequential.step_alpha`), and a step
   resumed after a controller restart gets a tenth of what its previous run had left
   (:func:`~controller.canary.sequential.segment_alpha`) rather than a fresh budget.
3. **The window.** Once ``window_s`` has passed since the window began, it is judged
   (:mod:`controller.canary.window`). A data-sparse window answers HOLD ``insufficient_data``,
   touches no streak, and keeps accumulating (the next judgement is one window later), so a
   quiet arm eventually gathers enough. A judged window moves the streak and a new window
   begins: ``healthy_windows_to_advance`` healthy windows in a row ADVANCE to the next step (or
   PROMOTE after the last); an unhealthy or inconclusive window restarts the streak and HOLDs,
   saying why. Windows never roll back: a window's tests look once at a few seconds of
   clustered evidence (a failed batch, a burst of slow requests) and cannot keep a stated
   false-alarm rate over the hundreds of looks of a rollout (ADR 0008); a canary that never
   earns its healthy windows is rolled back by ``max_duration``.

The gates (:mod:`controller.canary.gates`) decide whether a verdict moves traffic: paused, a
healthy streak HOLDs ``paused`` (and a proven regression is held once, ``rollback_held``, when
auto-rollback is off); a move that needs approval HOLDs ``awaiting_approval`` once and waits
for :meth:`RolloutRun.approve`; analysis-only records every decision with ``applied`` False and
keeps routing the first step's share. Time spent paused or awaiting approval does not count
towards ``max_duration``.

A new step starts fresh windows, fresh streaks and fresh sequential evidence: the canary's
behaviour can depend on its share of traffic (an under-provisioned canary is fine at 1 % and
slow at 50 %), so what 1 % proved does not speak for 25 %. ROLLBACK and PROMOTE are terminal:
the run ignores further evidence and ticks return None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from controller.canary.evidence import ArmAccumulator
from controller.canary.gates import (
    APPROVED,
    AWAITING_APPROVAL,
    PAUSED,
    ROLLBACK_HELD,
    Gates,
    NotAwaitingApproval,
)
from controller.canary.model import (
    ArmEvidence,
    Decision,
    JudgePolicy,
    RolloutAction,
)
from controller.canary.progress import StepProgress
from controller.canary.sequential import SequentialTests, segment_alpha, step_alpha
from controller.canary.window import HEALTHY, INSUFFICIENT, Verdict, judge_window

__all__ = ["RolloutRun"]

FloatArray = npt.NDArray[np.float64]

AWAITING_CONFIRMATION = "awaiting_confirmation"
MAX_DURATION = "max_duration"


def _latencies(evidence: ArmEvidence) -> FloatArray:
    values = np.asarray(evidence.latencies_s, dtype=np.float64).reshape(-1)
    if values.size and not (np.all(np.isfinite(values)) and float(values.min()) >= 0.0):
        raise ValueError("latencies must be finite and >= 0 seconds")
    return values


class RolloutRun(StepProgress):
    """Steps plus judge for one rollout (see the module docstring)."""

    def __init__(
        self,
        *,
        steps: Sequence[float],
        policy: JudgePolicy,
        started_at: float,
        step_index: int = 0,
        resumed_at: float | None = None,
        gates: Gates | None = None,
        awaiting_approval: bool = False,
        resumes_in_step: int = 0,
    ) -> None:
        super().__init__(steps, step_index)
        if resumes_in_step < 0:
            raise ValueError(f"resumes_in_step must be >= 0, got {resumes_in_step}")
        self.policy = policy
        self.started_at = float(started_at)
        self.healthy_streak = 0
        self.unhealthy_streak = 0
        self._gates = gates or Gates()
        self._resumes_in_step = resumes_in_step
        self._last_now = self.started_at if resumed_at is None else float(resumed_at)
        self._awaiting = awaiting_approval
        self._breach_held = False
        # When a hold (paused, awaiting approval) began: held time is not the judge's time.
        self._held_since: float | None = self._last_now if self._held() else None
        self._tests_step = step_index
        self._begin_step(self._last_now)

    # -- state the shell reads (also: step_index, canary_percent, weight_bp, phase, done) ----

    @property
    def window_started_at(self) -> float:
        return self._window_start

    @property
    def gates(self) -> Gates:
        return self._gates

    @property
    def awaiting_approval(self) -> bool:
        """The judge found the step healthy and waits for :meth:`approve`."""
        return self._awaiting and not self.done

    @property
    def resumes_in_step(self) -> int:
        """How many times the current step was resumed after a restart (0 once it advances)."""
        return self._resumes_in_step

    @property
    def weight_bp(self) -> int:
        """What the gateways route to the canary: analysis-only keeps the first step's share."""
        if not self._gates.analysis_only:
            return super().weight_bp
        if self.done:
            return 0
        return max(0, min(10000, round(self.steps[0] * 100.0)))

    # -- operator gates --------------------------------------------------------------------

    def set_gates(self, gates: Gates, now: float) -> None:
        """Pause or resume (``paused``, ``auto_rollback``); approval and analysis-only stay."""
        now = self._advance_clock(now)
        was_held = self._held()
        self._gates = Gates(
            paused=gates.paused,
            auto_rollback=gates.auto_rollback,
            approval=self._gates.approval,
            analysis_only=self._gates.analysis_only,
        )
        if not gates.paused:
            self._breach_held = False  # resumed: a held regression is acted on again
        self._track_hold(was_held, now)

    def approve(self, now: float) -> Decision:
        """Apply the move the judge is waiting on (ADVANCE or PROMOTE, reason ``approved``)."""
        now = self._advance_clock(now)
        if not self.awaiting_approval:
            where = (
                "it has ended"
                if self.done
                else (
                    f"it is at step {self.step_index + 1} of {len(self.steps)} "
                    f"({self.canary_percent:g}%) and has not yet proven the step healthy"
                )
            )
            raise NotAwaitingApproval(f"the rollout is not awaiting approval: {where}")
        was_held = self._held()
        self._awaiting = False
        self._track_hold(was_held, now)
        action = RolloutAction.PROMOTE if self.last_step else RolloutAction.ADVANCE
        what = (
            "promotion"
            if action is RolloutAction.PROMOTE
            else (f"the advance to {self.steps[self.step_index + 1]:g}%")
        )
        decision = self._decide(
            action,
            APPROVED,
            f"an operator approved {what}",
            self._window_baseline,
            self._window_canary,
            {},
        )
        if action is RolloutAction.ADVANCE:
            self._begin_step(now)
        return decision

    def _held(self) -> bool:
        return self._gates.paused or self._awaiting

    def _track_hold(self, was_held: bool, now: float) -> None:
        """Keep held time out of ``max_duration``: the deadline moves by the time held."""
        held = self._held()
        if held and not was_held:
            self._held_since = now
        elif was_held and not held and self._held_since is not None:
            self.started_at += now - self._held_since
            self._held_since = None

    # -- evidence and decisions ------------------------------------------------------------

    def observe(self, baseline: ArmEvidence, canary: ArmEvidence, now: float) -> None:
        """Add each arm's new evidence (deltas) gathered up to ``now``."""
        if self.done:
            return
        self._advance_clock(now)
        b_lat, c_lat = _latencies(baseline), _latencies(canary)
        self._window_baseline.add(baseline, b_lat)
        self._window_canary.add(canary, c_lat)
        self._tests.observe(baseline, canary, b_lat, c_lat, self._last_now)

    def tick(self, now: float) -> Decision | None:
        """The decision due at ``now``, or None when there is nothing to decide yet."""
        if self.done:
            return None
        now = self._advance_clock(now)
        if not self._held() and now - self.started_at >= self.policy.max_duration_s:
            return self._max_duration(now)
        breach = self._tests.check() if not self._breach_held else None
        if breach is not None:
            if self._gates.paused and not self._gates.auto_rollback:
                self._breach_held = True
                return self._decide(
                    RolloutAction.HOLD,
                    ROLLBACK_HELD,
                    f"{breach.detail}; auto-rollback is off while paused: holding at "
                    f"{self.canary_percent:g}% for an operator to abort or resume",
                    self._tests.baseline,
                    self._tests.canary,
                    {**breach.statistics, "held_reason_" + breach.reason: 1.0},
                )
            return self._decide(
                RolloutAction.ROLLBACK,
                breach.reason,
                breach.detail,
                self._tests.baseline,
                self._tests.canary,
                breach.statistics,
            )
        if self._awaiting or now < self._next_judgement:
            return None
        return self._judge(now)

    # -- internals -------------------------------------------------------------------------

    def _advance_clock(self, now: float) -> float:
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite time in seconds, got {now}")
        # Time never runs backwards for the judge: an earlier reading is taken as "no time".
        self._last_now = max(self._last_now, float(now))
        return self._last_now

    def _begin_step(self, now: float) -> None:
        if self.step_index != self._tests_step:
            self._resumes_in_step = 0  # a new step: its budget has not been touched
        self._tests_step = self.step_index
        self.healthy_streak = 0
        self.unhealthy_streak = 0
        alpha = segment_alpha(
            step_alpha(self.policy.false_alarm_rate, self.step_index, len(self.steps)),
            self._resumes_in_step,
        )
        self._tests = SequentialTests(self.policy, alpha)
        self._begin_window(now)

    def _begin_window(self, now: float) -> None:
        self._window_start = now
        self._next_judgement = now + self.policy.window_s
        self._window_baseline = ArmAccumulator(self.policy.max_samples_per_arm)
        self._window_canary = ArmAccumulator(self.policy.max_samples_per_arm)

    def _judge(self, now: float) -> Decision:
        verdict = judge_window(self._window_baseline, self._window_canary, self.policy)
        baseline, canary = self._window_baseline, self._window_canary
        stats = dict(verdict.statistics)
        if verdict.verdict is Verdict.SPARSE:
            # Data-sparse: no streak moves and the window keeps its evidence.
            self._next_judgement = now + self.policy.window_s
            return self._decide(
                RolloutAction.HOLD,
                INSUFFICIENT,
                verdict.detail,
                baseline,
                canary,
                stats,
                needed=verdict.needed_requests,
            )
        if verdict.verdict is Verdict.HEALTHY:
            self.healthy_streak += 1
            self.unhealthy_streak = 0
        elif verdict.verdict is Verdict.UNHEALTHY:
            self.unhealthy_streak += 1
            self.healthy_streak = 0
        else:  # inconclusive: not healthy, not (yet) unhealthy
            self.healthy_streak = 0
        stats["healthy_streak"] = float(self.healthy_streak)
        stats["unhealthy_streak"] = float(self.unhealthy_streak)
        if self.healthy_streak >= self.policy.healthy_windows_to_advance:
            return self._healthy_step(now, verdict.detail, baseline, canary, stats)
        self._begin_window(now)
        if verdict.verdict is Verdict.INCONCLUSIVE:
            reason, detail = verdict.reason, verdict.detail
        elif verdict.verdict is Verdict.HEALTHY:
            reason = AWAITING_CONFIRMATION
            detail = (
                f"{verdict.detail} (healthy window {self.healthy_streak} of "
                f"{self.policy.healthy_windows_to_advance})"
            )
        else:
            reason = verdict.reason
            detail = (
                f"{verdict.detail}: an unhealthy window ({self.unhealthy_streak} in a row) "
                "holds the step; only the sequential tests roll back"
            )
        return self._decide(RolloutAction.HOLD, reason, detail, baseline, canary, stats)

    def _healthy_step(
        self,
        now: float,
        verdict_detail: str,
        baseline: ArmAccumulator,
        canary: ArmAccumulator,
        stats: dict[str, float],
    ) -> Decision:
        """The step is proven healthy: move on — unless a gate holds the move."""
        detail = f"{verdict_detail}; healthy for {self.healthy_streak} windows in a row"
        action = RolloutAction.PROMOTE if self.last_step else RolloutAction.ADVANCE
        move = (
            "promote"
            if action is RolloutAction.PROMOTE
            else (f"advance to {self.steps[self.step_index + 1]:g}%")
        )
        if self._gates.paused:
            # Keep the streak: the first healthy window after a resume moves on.
            self._begin_window(now)
            return self._decide(
                RolloutAction.HOLD,
                PAUSED,
                f"{detail}: would {move}, but the rollout is paused",
                baseline,
                canary,
                stats,
            )
        if self._gates.needs_approval(action is RolloutAction.PROMOTE):
            was_held = self._held()
            self._awaiting = True
            self._track_hold(was_held, now)
            self._begin_window(now)
            return self._decide(
                RolloutAction.HOLD,
                AWAITING_APPROVAL,
                f"{detail}: ready to {move}; waiting for an operator's approval "
                "(halcyon rollout approve)",
                baseline,
                canary,
                stats,
            )
        decision = self._decide(action, HEALTHY, detail, baseline, canary, stats)
        if action is RolloutAction.ADVANCE:
            self._begin_step(now)
        return decision

    def _max_duration(self, now: float) -> Decision:
        elapsed = now - self.started_at
        return self._decide(
            RolloutAction.ROLLBACK,
            MAX_DURATION,
            f"rollout ran {elapsed:.0f} s, past its {self.policy.max_duration_s:g} s maximum, "
            f"without proving the canary healthy at step {self.step_index + 1} of "
            f"{len(self.steps)} ({self.canary_percent:g}%)",
            self._window_baseline,
            self._window_canary,
            {"elapsed_s": elapsed, "max_duration_s": self.policy.max_duration_s},
        )

    def _decide(
        self,
        action: RolloutAction,
        reason: str,
        detail: str,
        baseline: ArmAccumulator,
        canary: ArmAccumulator,
        stats: dict[str, float],
        *,
        needed: int = 0,
    ) -> Decision:
        """Apply ``action`` and describe it with the evidence it was taken on."""
        from_percent, to_percent = self._move(action)
        moves = action is not RolloutAction.HOLD
        return Decision(
            action=action,
            reason=reason,
            detail=detail,
            from_percent=from_percent,
            to_percent=to_percent,
            baseline=baseline.summary(),
            canary=canary.summary(),
            statistics=stats,
            needed_requests=needed,
            applied=not (moves and self._gates.analysis_only),
        )
