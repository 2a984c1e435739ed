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
   step: the moment a guard's breach is proven, ROLLBACK — whatever the window.
3. **The window.** Once ``window_s`` has passed since the window began, it is judged
   (:mod:`controller.canary.window`). A data-sparse window answers HOLD ``insufficient_data``,
   touches no streak, and keeps accumulating (the next judgement is one window later), so a
   quiet arm eventually gathers enough. A judged window moves a streak and a new window begins:
   ``healthy_windows_to_advance`` healthy windows in a row ADVANCE to the next step (or PROMOTE
   after the last), ``unhealthy_windows_to_rollback`` unhealthy ones in a row ROLLBACK; anything
   short of that is a HOLD saying why.

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
from controller.canary.model import (
    ArmEvidence,
    Decision,
    JudgePolicy,
    RolloutAction,
)
from controller.canary.progress import StepProgress
from controller.canary.sequential import SequentialTests, step_alpha
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
    ) -> None:
        super().__init__(steps, step_index)
        self.policy = policy
        self.started_at = float(started_at)
        self.healthy_streak = 0
        self.unhealthy_streak = 0
        self._last_now = self.started_at if resumed_at is None else float(resumed_at)
        self._begin_step(self._last_now)

    # -- state the shell reads (also: step_index, canary_percent, weight_bp, phase, done) ----

    @property
    def window_started_at(self) -> float:
        return self._window_start

    # -- evidence and decisions ------------------------------------------------------------

    def observe(self, baseline: ArmEvidence, canary: ArmEvidence, now: float) -> None:
        """Add each arm's new evidence (deltas) gathered up to ``now``."""
        if self.done:
            return
        self._advance_clock(now)
        b_lat, c_lat = _latencies(baseline), _latencies(canary)
        self._window_baseline.add(baseline, b_lat)
        self._window_canary.add(canary, c_lat)
        self._tests.observe(baseline, canary, b_lat, c_lat)

    def tick(self, now: float) -> Decision | None:
        """The decision due at ``now``, or None when there is nothing to decide yet."""
        if self.done:
            return None
        now = self._advance_clock(now)
        if now - self.started_at >= self.policy.max_duration_s:
            return self._max_duration(now)
        breach = self._tests.check()
        if breach is not None:
            return self._decide(
                RolloutAction.ROLLBACK,
                breach.reason,
                breach.detail,
                self._tests.baseline,
                self._tests.canary,
                breach.statistics,
            )
        if now < self._next_judgement:
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
        self.healthy_streak = 0
        self.unhealthy_streak = 0
        alpha = step_alpha(self.policy.false_alarm_rate, self.step_index, len(self.steps))
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
        if self.unhealthy_streak >= self.policy.unhealthy_windows_to_rollback:
            detail = f"{verdict.detail} ({self.unhealthy_streak} unhealthy windows in a row)"
            return self._decide(
                RolloutAction.ROLLBACK, verdict.reason, detail, baseline, canary, stats
            )
        if self.healthy_streak >= self.policy.healthy_windows_to_advance:
            detail = f"{verdict.detail}; healthy for {self.healthy_streak} windows in a row"
            action = RolloutAction.PROMOTE if self.last_step else RolloutAction.ADVANCE
            decision = self._decide(action, HEALTHY, detail, baseline, canary, stats)
            if action is RolloutAction.ADVANCE:
                self._begin_step(now)
            return decision
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
                f"{verdict.detail} (unhealthy window {self.unhealthy_streak} of "
                f"{self.policy.unhealthy_windows_to_rollback})"
            )
        return self._decide(RolloutAction.HOLD, reason, detail, baseline, canary, stats)

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
        )
