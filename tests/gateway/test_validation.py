"""Infer request validation: every bad field is named; deadlines take the earliest bound."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st

from common.errors import RichError
from gateway.validation import MAX_INPUT_BYTES, count_input_tokens, validate
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
