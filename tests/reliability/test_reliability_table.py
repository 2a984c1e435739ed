"""The reliability table's definitions: what counts as lost, and when a fault is recovered.

Pure and fast, so these run in ``make test`` (no ``reliability`` marker).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from reliability_table import (
    Row,
    Window,
    is_answer,
    lost_outcomes,
    reason_of,
    recovery_time,
    render,
    sheds_by_reason,
    windows_from_timeline,
)


def test_outcome_keys_are_answers_only_with_a_halcyon_reason() -> None:
    assert is_answer("OK")
    assert is_answer("UNAVAILABLE/OVERLOADED")
    assert reason_of("DEADLINE_EXCEEDED/DEADLINE_MISSED") == "DEADLINE_MISSED"
    # A client-side deadline, a transport failure, a bare INTERNAL: no Halcyon answer.
    for lost in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "INTERNAL", "UNKNOWN", "CANCELLED/"):
        assert not is_answer(lost), lost
    outcomes = {"OK": 5, "UNAVAILABLE/NO_CAPACITY": 2, "DEADLINE_EXCEEDED": 3, "UNKNOWN": 0}
    assert lost_outcomes(outcomes) == {"DEADLINE_EXCEEDED": 3}
    assert sheds_by_reason(
        {"UNAVAILABLE/OVERLOADED": 1, "RESOURCE_EXHAUSTED/QUOTA_EXCEEDED": 4, "OK": 9}
    ) == {"QUOTA_EXCEEDED": 4, "OVERLOADED": 1}


def test_windows_come_from_the_loadtest_timeline() -> None:
    timeline = [
        {"t": 0, "ok": 90, "on_time": 90, "rejected": {"OVERLOADED": 8}, "lost": 2},
        {"t": 1, "ok": 0, "on_time": 0, "rejected": {}, "lost": 0},
    ]
    assert windows_from_timeline(timeline) == [Window(0.0, 90, 100), Window(1.0, 0, 0)]


def _windows(rates: list[float], per_window: int = 100) -> list[Window]:
    return [Window(float(t), round(r * per_window), per_window) for t, r in enumerate(rates)]


def test_recovery_is_zero_when_no_window_after_the_fault_falls_short() -> None:
    assert recovery_time(_windows([1.0, 1.0, 0.99, 0.96, 1.0]), fault_at_s=2.3) == 0.0


def test_recovery_ends_with_the_last_short_window() -> None:
    # Pre-fault 100 %; windows 3 and 5 fall below 95 %; 4 recovered in between does not count.
    windows = _windows([1.0, 1.0, 1.0, 0.5, 0.97, 0.9, 1.0, 1.0])
    assert recovery_time(windows, fault_at_s=3.25) == pytest.approx(6.0 - 3.25)


def test_the_window_holding_the_fault_counts_and_tolerance_is_relative() -> None:
    # Pre-fault level 50 % (an overloaded fleet): 47.6 % is within 5 %, 47.4 % is not.
    assert recovery_time(_windows([0.5, 0.5, 0.476, 0.5], 1000), fault_at_s=2.5) == 0.0
    assert recovery_time(_windows([0.5, 0.5, 0.474, 0.5], 1000), fault_at_s=2.5) == 0.5


def test_a_window_in_which_nothing_ended_is_short_and_a_short_end_is_not_recovered() -> None:
    windows = [*_windows([1.0, 1.0]), Window(2.0, 0, 0), *_windows([1.0])]
    windows[-1] = Window(3.0, 100, 100)
    assert recovery_time(windows, fault_at_s=2.0) == 1.0
    assert math.isinf(recovery_time(_windows([1.0, 1.0, 0.2]), fault_at_s=2.0))


def test_recovery_needs_a_window_before_the_fault() -> None:
    with pytest.raises(ValueError, match="before the fault"):
        recovery_time(_windows([1.0, 1.0]), fault_at_s=0.5)


@given(
    rates=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=30),
    fault=st.floats(1.0, 29.0),
)
def test_recovery_is_zero_inf_or_ends_on_a_window_boundary(
    rates: list[float], fault: float
) -> None:
    assume(fault <= len(rates))
    windows = _windows(rates)
    got = recovery_time(windows, fault_at_s=fault)
    assert got == 0.0 or math.isinf(got) or (got + fault) == pytest.approx(round(got + fault))
    assert got >= 0.0


def test_the_table_shows_every_row_and_explains_what_failed() -> None:
    rows = [
        Row("worker kill -9", 3000, 3000, 300.0, 150.0, {"UPSTREAM_FAILURE": 2}, 0.0),
        Row(
            "hung worker",
            2000,
            1956,
            190.2,
            1990.0,
            {},
            math.inf,
            lost_detail={"DEADLINE_EXCEEDED": 44},
            failures=["success rate 97.8 % < 99 %"],
        ),
        Row("fuzz", 500, 500, notes=["codes: INVALID_ARGUMENT 300"]),
    ]
    text = render(rows)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["scenario", "requests", "answered", "lost"]
    assert "worker kill -9" in lines[2] and "UPSTREAM_FAILURE 2" in lines[2]
    assert lines[2].endswith("holds")
    assert "not recovered" in lines[3] and lines[3].endswith("FAILS")
    assert "* hung worker: 44 lost (DEADLINE_EXCEEDED 44)" in lines
    assert "* hung worker: success rate 97.8 % < 99 %" in lines
    assert "  fuzz: codes: INVALID_ARGUMENT 300" in lines
    assert lines.index("* hung worker: 44 lost (DEADLINE_EXCEEDED 44)") < lines.index(
        "* hung worker: success rate 97.8 % < 99 %"
    )
    assert rows[0].passed and not rows[1].passed and rows[1].lost == 44


def test_long_footnotes_wrap_and_many_reasons_are_summed() -> None:
    row = Row(
        "fuzz",
        10,
        10,
        sheds={"A": 5, "B": 4, "C": 3, "D": 2, "E": 1},
        notes=["word " * 60],
    )
    text = render([row])
    assert "A 5, B 4, C 3, 2 more 3" in text
    footnotes = text.splitlines()[3:]
    assert len(footnotes) > 1 and all(len(line) <= 100 for line in footnotes)
    assert all(line.startswith("    ") for line in footnotes[1:])
