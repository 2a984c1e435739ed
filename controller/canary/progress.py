"""Where a rollout stands on its steps: the canary's share now, and whether it has ended.

What it decides: the canary's traffic share for each state — the current step while
progressing, 100 % once promoted, 0 % once rolled back — and how an action moves the state
(ADVANCE to the next step, PROMOTE and ROLLBACK to their terminal phases, HOLD nowhere). Shared
by :class:`~controller.canary.run.RolloutRun` and the simulation's rival judges, so every judge
moves traffic by the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.canary.model import RolloutAction, RolloutPhase
from controller.canary.steps import normalize_steps

__all__ = ["StepProgress"]

_TERMINAL = {
    RolloutAction.PROMOTE: RolloutPhase.PROMOTED,
    RolloutAction.ROLLBACK: RolloutPhase.ROLLED_BACK,
}


class StepProgress:
    """Steps, the current step and the phase of one rollout."""

    def __init__(self, steps: Sequence[float], step_index: int = 0) -> None:
        self.steps = normalize_steps(steps)
        if not 0 <= step_index < len(self.steps):
            raise ValueError(
                f"step_index {step_index} is outside the {len(self.steps)} steps {self.steps}"
            )
        self.step_index = step_index
        self.phase = RolloutPhase.PROGRESSING

    @property
    def done(self) -> bool:
        return self.phase is not RolloutPhase.PROGRESSING

    @property
    def last_step(self) -> bool:
        return self.step_index == len(self.steps) - 1

    @property
    def canary_percent(self) -> float:
        """The canary's traffic share now: the current step; 100 once promoted, 0 rolled back."""
        if self.phase is RolloutPhase.PROMOTED:
            return 100.0
        if self.phase is RolloutPhase.ROLLED_BACK:
            return 0.0
        return self.steps[self.step_index]

    @property
    def weight_bp(self) -> int:
        """:attr:`canary_percent` in basis points, in [0, 10000]."""
        return max(0, min(10000, round(self.canary_percent * 100.0)))

    def _move(self, action: RolloutAction) -> tuple[float, float]:
        """Apply ``action``; returns the canary percent before and after it."""
        before = self.canary_percent
        if action is RolloutAction.ADVANCE:
            if self.last_step:
                raise ValueError("cannot advance past the last step: promote instead")
            self.step_index += 1
        elif action in _TERMINAL:
            self.phase = _TERMINAL[action]
        return before, self.canary_percent
