"""Canary traffic steps: what a user may type and what the rollout runs.

What it decides: the step list a rollout walks. Empty means the default 1 → 5 → 25 → 50 %; a
final 100 means "then promote" (``[5, 25, 50, 100]`` is the first thing users type) and is
dropped, because promotion follows the last step and a 100 % step would leave no baseline to
compare against (defect 2 of the original). Every other step must lie strictly between 0 and
100 and the list must increase strictly; anything else is an ``InvalidSteps`` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DEFAULT_STEPS", "MIN_STEP", "InvalidSteps", "normalize_steps"]

DEFAULT_STEPS: tuple[float, ...] = (1.0, 5.0, 25.0, 50.0)
MIN_STEP = 0.01  # percent: one basis point, the gateways' routing resolution


class InvalidSteps(ValueError):
    """Steps no rollout can run; ``field`` is the request field, ``description`` what to fix."""

    field = "step_percents"

    def __init__(self, description: str) -> None:
        super().__init__(f"step_percents: {description}")
        self.description = description


def normalize_steps(steps: Sequence[float]) -> tuple[float, ...]:
    """The steps a rollout runs: defaults for none, a final 100 dropped, the rest validated."""
    values = [float(p) for p in steps]
    if not values:
        return DEFAULT_STEPS
    if len(values) > 1 and values[-1] == 100.0:
        values = values[:-1]
    elif values == [100.0]:
        raise InvalidSteps(
            "a single step of 100 leaves nothing to compare against: give at least one step "
            "below 100, e.g. 5,25,50,100 (or none for the default 1,5,25,50)"
        )
    previous: float | None = None
    for i, p in enumerate(values):
        if not (math.isfinite(p) and 0.0 < p < 100.0):
            raise InvalidSteps(
                f"step {i} is {p:g}: every step must be a percentage strictly between 0 and "
                "100 (a final 100 means promote), e.g. 1,5,25,50"
            )
        if previous is not None and p <= previous:
            raise InvalidSteps(
                f"step {i} ({p:g}) does not exceed step {i - 1} ({previous:g}): steps must "
                "increase strictly, e.g. 1,5,25,50"
            )
        if p < MIN_STEP:
            raise InvalidSteps(
                f"step {i} is {p:g}%: the smallest share a gateway can route is "
                f"{MIN_STEP:g}% (one basis point)"
            )
        previous = p
    return tuple(values)
