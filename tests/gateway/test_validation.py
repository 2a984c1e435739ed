"""Infer request validation: every bad field is named; deadlines take the earliest bound."""

from __future__ import annotations

import math

import grpc
import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st

from common.errors import RichError
from gateway.validation import MAX_INPUT_BYTES, MAX_TIMEOUT_S, count_input_tokens, validate
from halcyon.v1 import infer_pb2


def ok_request(**overrides: object) -> infer_pb2.InferRequest:
    fields: dict[str, object] = {"model": "llama-3-8b", "input": "hello", "max_output_tokens": 64}
    fields.update(overrides)
    return infer_pb2.InferRequest(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"model": ""}, "model"),
        ({"model": "m" * 129}, "model"),
        ({"input": ""}, "input"),
        ({"input": "x" * (MAX_INPUT_BYTES + 1)}, "input"),
        ({"max_output_tokens": 5000}, "max_output_tokens"),
        ({"session_key": "k" * 257}, "session_key"),
        ({"priority": 9}, "priority"),
        ({"lane": 7}, "lane"),
        ({"timeout": duration_pb2.Duration(seconds=-1)}, "timeout"),
        ({"timeout": duration_pb2.Duration(seconds=0)}, "timeout"),
    ],
)
def test_bad_field_is_named(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(RichError) as exc:
        validate(ok_request(**overrides), None, 10.0)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in exc.value.field_violations] == [field]


def test_defaults_apply() -> None:
    v = validate(ok_request(max_output_tokens=0), None, 7.0)
    assert v.max_output_tokens == 64
    assert v.timeout_s == 7.0
    assert not v.bulk


def test_timeout_field_tightens_grpc_deadline_but_never_loosens_it() -> None:
    tighter = validate(ok_request(timeout=duration_pb2.Duration(nanos=500_000_000)), 2.0, 10.0)
    assert tighter.timeout_s == pytest.approx(0.5)
    looser = validate(ok_request(timeout=duration_pb2.Duration(seconds=9)), 2.0, 10.0)
    assert looser.timeout_s == pytest.approx(2.0)
    alone = validate(ok_request(timeout=duration_pb2.Duration(seconds=3)), None, 10.0)
    assert alone.timeout_s == pytest.approx(3.0)


def test_bulk_lane() -> None:
    assert validate(ok_request(lane=infer_pb2.LANE_BULK), None, 1.0).bulk


@given(st.text(min_size=1, max_size=300))
def test_token_estimate_is_positive_and_grows_with_text(text: str) -> None:
    n = count_input_tokens(text)
    assert n >= 1
    assert count_input_tokens(text + "abcd") == n + 1


def test_timeout_beyond_the_maximum_is_invalid_and_names_the_field() -> None:
    # 1e10 s is a valid Duration; as a deadline it overflowed the gateway's own worker calls.
    for seconds, nanos in ((10_000_000_000, 0), (int(MAX_TIMEOUT_S) + 1, 0), (600, 1)):
        with pytest.raises(RichError) as exc:
            validate(
                ok_request(timeout=duration_pb2.Duration(seconds=seconds, nanos=nanos)), None, 10
            )
        assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in exc.value.field_violations] == ["timeout"]
        assert "limit" in exc.value.field_violations[0].description
    at_limit = validate(ok_request(timeout=duration_pb2.Duration(seconds=600)), None, 10.0)
    assert at_limit.timeout_s == MAX_TIMEOUT_S


@pytest.mark.parametrize("remaining", [1e9, 1e300, math.inf, math.nan])
def test_a_huge_grpc_deadline_is_clamped_to_the_maximum(remaining: float) -> None:
    v = validate(ok_request(), remaining, 10.0)
    expected = 10.0 if math.isnan(remaining) else MAX_TIMEOUT_S  # NaN: as if none was set
    assert v.timeout_s == expected
    tighter = validate(ok_request(timeout=duration_pb2.Duration(seconds=3)), remaining, 10.0)
    assert tighter.timeout_s == 3.0


def test_a_default_timeout_beyond_the_maximum_is_clamped() -> None:
    assert validate(ok_request(), None, 1e12).timeout_s == MAX_TIMEOUT_S


@given(
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    st.one_of(st.none(), st.integers(0, 315_576_000_000)),
    st.integers(0, 999_999_999),
)
def test_every_accepted_deadline_is_finite_and_within_the_maximum(
    remaining: float | None, seconds: int | None, nanos: int
) -> None:
    req = (
        ok_request()
        if seconds is None
        else ok_request(timeout=duration_pb2.Duration(seconds=seconds, nanos=nanos))
    )
    try:
        v = validate(req, remaining, 10.0)
    except RichError as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [f.field for f in err.field_violations] == ["timeout"]
        return
    assert math.isfinite(v.timeout_s)
    assert v.timeout_s <= MAX_TIMEOUT_S
