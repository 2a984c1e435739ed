"""The one check of a received Duration (``checked_seconds``) and the one way a status repeats
a client's string (``echo``): what each accepts, refuses, and how it says so."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st

from common.durations import PROTO_MAX_SECONDS, DurationOutOfRange, checked_seconds
from common.errors import ECHO_CHARS, echo, internal, invalid_argument

INT64_MAX = 2**63 - 1


def _d(seconds: int, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


def test_the_maximum_itself_is_accepted_and_one_nanosecond_more_is_not() -> None:
    assert checked_seconds(_d(3600), "policy.window", maximum_s=3600) == 3600.0
    with pytest.raises(DurationOutOfRange) as refused:
        checked_seconds(_d(3600, 1), "policy.window", maximum_s=3600)
    assert refused.value.field == "policy.window"
    assert "at most 3600 s" in refused.value.description


@pytest.mark.parametrize(
    ("duration", "words"),
    [
        (_d(INT64_MAX), "at most 3600 s"),
        (_d(PROTO_MAX_SECONDS + 1), "at most 3600 s"),
        (_d(-1), "must not be negative"),
        (_d(0, -1), "must not be negative"),
        (_d(-(2**63)), "must not be negative"),
        (_d(1, -5), "not a valid Duration"),
        (_d(-1, 5), "not a valid Duration"),
        (_d(0, 1_000_000_000), "not a valid Duration"),
        (_d(0, -(2**31)), "not a valid Duration"),
    ],
)
def test_malformed_negative_and_huge_durations_are_refused_naming_the_field(
    duration: duration_pb2.Duration, words: str
) -> None:
    with pytest.raises(DurationOutOfRange) as refused:
        checked_seconds(duration, "latency", maximum_s=3600)
    assert refused.value.field == "latency"
    assert words in refused.value.description
    assert len(refused.value.description) < 200


def test_zero_is_refused_only_where_a_positive_value_is_required() -> None:
    assert checked_seconds(_d(0), "grace", maximum_s=10) == 0.0
    with pytest.raises(DurationOutOfRange, match="must be positive"):
        checked_seconds(_d(0), "policy.window", maximum_s=10, positive=True)


@given(
    seconds=st.integers(-(2**63), 2**63 - 1),
    nanos=st.integers(-(2**31), 2**31 - 1),
)
def test_any_wire_duration_gives_seconds_in_range_or_a_refusal(seconds: int, nanos: int) -> None:
    try:
        value = checked_seconds(_d(seconds, nanos), "x", maximum_s=3600)
    except DurationOutOfRange as exc:
        assert exc.field == "x"
    else:
        assert 0.0 <= value <= 3600.0


def test_echo_keeps_short_values_and_cuts_long_ones_with_their_length() -> None:
    assert echo("replica-a") == "replica-a"
    assert echo("x" * ECHO_CHARS) == "x" * ECHO_CHARS
    cut = echo("x" * 1_048_576)
    assert cut == "x" * ECHO_CHARS + "… (1,048,576 chars)"


def test_builders_never_repeat_a_megabyte() -> None:
    err = invalid_argument("items[0].id", "duplicate item id " + "y" * 1_048_576)
    assert len(err.message) < 1024
    assert sum(len(v) for k, v in err.trailing_metadata() if isinstance(v, bytes)) < 2048


def test_internal_carries_a_reason() -> None:
    err = internal("the response could not be built")
    assert err.reason == "INTERNAL"
    assert err.to_proto().details[0].type_url.endswith("ErrorInfo")
