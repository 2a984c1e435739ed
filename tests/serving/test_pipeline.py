"""The unary pipeline alone (``common.pipeline``): layers in order, refusals, holds, decoding,
error mapping and the ended hooks, over a stand-in call; and the tracing layer's spans."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import common.tracing as tracing
from common.call import HELD, UnaryCall, Verdict
from common.errors import Reason, RichError, unauthenticated
from common.pipeline import REFUSED, Layer, UnaryPipeline
from common.size_limit import SizeLimit
from common.tracing import TracingLayer, traced

METHOD = "/halcyon.test.P/Call"


class FakeCall:
    """A :class:`UnaryCall` that records its answer and how the pipeline ended it."""

    def __init__(self, request: bytes = b"", metadata: Any = ()) -> None:
        self.method = METHOD
        self.metadata = metadata
        self.request = request
        self.deadline: float | None = None
        self.started = time.perf_counter()
        self.span: trace.Span = trace.INVALID_SPAN
        self.on_cancel: Callable[[], object] | None = None
        self.answers: list[bytes | RichError] = []

    @property
    def open(self) -> bool:
        return not self.answers

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def time_remaining(self) -> float | None:
        return None

    def reply(self, payload: bytes) -> None:
        self.answers.append(payload)

    def reject(self, err: RichError) -> None:
        self.answers.append(err)


class Recording(Layer):
    def __init__(self, name: str, log: list[str], verdict: Verdict = None) -> None:
        self.name = name
        self.log = log
        self.verdict = verdict

    def admit(self, call: UnaryCall) -> Verdict:
        self.log.append(f"admit:{self.name}")
        return self.verdict

    def ended(self, call: UnaryCall, code: grpc.StatusCode, details: str) -> None:
        self.log.append(f"ended:{self.name}:{code.name}")


class AdmitOnly(Layer):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def admit(self, call: UnaryCall) -> Verdict:
        self.log.append("admit:only")
        return None


def _pipeline(layers: list[Layer], handler: Any, deserializer: Any = None) -> UnaryPipeline:
    return UnaryPipeline(
        METHOD,
        layers,
        deserializer=deserializer,
        message_type="google.protobuf.BytesValue",
        handler=handler,
    )


def test_layers_admit_outermost_first_and_end_innermost_first() -> None:
    log: list[str] = []
    seen: list[Any] = []

    def handler(message: Any, call: UnaryCall) -> None:
        seen.append(message)
        call.reply(b"ok")

    pipeline = _pipeline([Recording("a", log), AdmitOnly(log), Recording("b", log)], handler)
    call = FakeCall(b"raw")
    pipeline.run(call)
    pipeline.ended(call, grpc.StatusCode.OK, "")
    assert seen == [b"raw"]  # no deserializer: the bytes as received
    assert call.answers == [b"ok"]
    # A hook a layer does not override is not called at all.
    assert log == ["admit:a", "admit:only", "admit:b", "ended:b:OK", "ended:a:OK"]


def test_a_refusal_stops_the_layers_after_it_and_the_handler() -> None:
    log: list[str] = []
    refusal = unauthenticated("no", Reason.MISSING_CREDENTIALS)
    pipeline = _pipeline(
        [Recording("outer", log), Recording("auth", log, refusal), Recording("inner", log)],
        lambda *_: log.append("handler"),
    )
    call = FakeCall()
    pipeline.run(call)
    assert call.answers == [refusal]
    assert log == ["admit:outer", "admit:auth"]


def test_a_held_call_is_not_answered_by_the_pipeline() -> None:
    log: list[str] = []
    pipeline = _pipeline([Recording("gate", log, HELD)], lambda *_: log.append("handler"))
    call = FakeCall()
    assert pipeline.admit(call) is REFUSED
    assert call.answers == [] and log == ["admit:gate"]


def test_undecodable_bytes_are_invalid_argument_naming_the_type() -> None:
    pipeline = _pipeline([], lambda *_: None, deserializer=BytesValue.FromString)
    call = FakeCall(b"\xff\xff\xff")
    pipeline.run(call)
    (err,) = call.answers
    assert isinstance(err, RichError)
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert "google.protobuf.BytesValue" in err.message


def test_a_handler_bug_is_internal_with_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    def handler(message: Any, call: UnaryCall) -> None:
        raise KeyError("bug")

    pipeline = _pipeline([], handler, deserializer=BytesValue.FromString)
    call = FakeCall(BytesValue(value=b"x").SerializeToString())
    pipeline.run(call)
    (err,) = call.answers
    assert isinstance(err, RichError)
    assert (err.code, err.reason) == (grpc.StatusCode.INTERNAL, Reason.INTERNAL)
    assert "KeyError" in err.message
    assert [r for r in caplog.records if "handler failed" in r.getMessage()]


def test_the_size_limit_refuses_larger_requests_with_its_figures() -> None:
    limit = SizeLimit(METHOD, 4)
    assert limit.admit(FakeCall(b"1234")) is None
    err = limit.admit(FakeCall(b"12345"))
    assert isinstance(err, RichError)
    assert (err.code, err.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.MESSAGE_TOO_LARGE)
    assert err.metadata == {"size_bytes": "5", "limit_bytes": "4"}
    with pytest.raises(ValueError):
        SizeLimit(METHOD, 0)


def test_the_tracing_layer_spans_a_refused_call_and_none_when_nothing_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    layer = TracingLayer(provider.get_tracer("test"), METHOD)
    refusal = unauthenticated("no", Reason.MISSING_CREDENTIALS)
    pipeline = _pipeline([layer, Recording("auth", [], refusal)], lambda *_: None)
    call = FakeCall()
    pipeline.run(call)
    pipeline.ended(call, refusal.code, refusal.message)
    (span,) = exporter.get_finished_spans()
    assert span.name == METHOD and span.kind == trace.SpanKind.SERVER
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]

    monkeypatch.setattr(tracing, "_spans_recorded", False)
    quiet = FakeCall()
    pipeline.run(quiet)
    pipeline.ended(quiet, refusal.code, refusal.message)
    assert quiet.span is trace.INVALID_SPAN and len(exporter.get_finished_spans()) == 1


def test_probes_and_reflection_are_not_traced() -> None:
    assert traced(METHOD)
    assert not traced("/grpc.health.v1.Health/Check")
    assert not traced("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
