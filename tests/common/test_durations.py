"""Seconds <-> Duration round-trips to the nanosecond, sign included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from common.durations import to_duration, to_seconds


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_round_trip_to_the_nanosecond(seconds: float) -> None:
    assert abs(to_seconds(to_duration(seconds)) - seconds) <= 1e-9 + abs(seconds) * 1e-15


def test_json_form_is_what_grpcurl_users_write() -> None:
    assert to_duration(2.0).ToJsonString() == "2s"
    assert to_duration(0.0005).ToJsonString() == "0.000500s"
