"""normalize_steps: defaults, a final 100 as "promote", and errors a user can act on."""

from __future__ import annotations

import math

import pytest

from controller.canary import DEFAULT_STEPS, InvalidSteps, normalize_steps


def test_empty_means_the_default_steps() -> None:
    assert normalize_steps([]) == DEFAULT_STEPS == (1.0, 5.0, 25.0, 50.0)


def test_a_final_100_means_promote() -> None:
    assert normalize_steps([5, 25, 50, 100]) == (5.0, 25.0, 50.0)
    assert normalize_steps([10, 100]) == (10.0,)


def test_valid_steps_are_kept_as_floats() -> None:
    assert normalize_steps([0.5, 2, 30.25]) == (0.5, 2.0, 30.25)


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        ([100], "single step of 100"),
        ([0, 5], "strictly between 0 and 100"),
        ([5, 120], "strictly between 0 and 100"),
        ([-1], "strictly between 0 and 100"),
        ([math.nan], "strictly between 0 and 100"),
        ([math.inf], "strictly between 0 and 100"),
        ([5, 5], "increase strictly"),
        ([25, 5], "increase strictly"),
        ([50, 100, 100], "strictly between 0 and 100"),
        ([0.001], "one basis point"),
    ],
)
def test_invalid_steps_name_the_field_and_what_to_do(steps: list[float], words: str) -> None:
    with pytest.raises(InvalidSteps) as info:
        normalize_steps(steps)
    assert info.value.field == "step_percents"
    assert words in info.value.description
    assert isinstance(info.value, ValueError)
