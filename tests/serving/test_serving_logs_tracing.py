"""JSON log lines (with trace ids inside spans) and W3C trace context across metadata."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.logs import JsonFormatter, configure_logging
from common.tracing import extract_context, inject_metadata


@pytest.fixture
def tracer() -> trace.Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return provider.get_tracer("test")


def _capture() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("svc"))
    logger = logging.getLogger("halcyon.test.logs")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def test_json_line_has_fields_extras_and_no_trace_outside_spans() -> None:
    logger, stream = _capture()
    logger.info("hello %s", "world", extra={"replica_id": "r1", "n": 3, "obj": object()})
    entry = json.loads(stream.getvalue())
    assert entry["msg"] == "hello world"
    assert entry["level"] == "INFO"
    assert entry["service"] == "svc"
    assert entry["logger"] == "halcyon.test.logs"
    assert entry["replica_id"] == "r1" and entry["n"] == 3
    assert isinstance(entry["obj"], str)
    assert entry["ts"].endswith("+00:00")
    assert "trace_id" not in entry


def test_json_line_inside_a_span_carries_its_ids(tracer: trace.Tracer) -> None:
    logger, stream = _capture()
    with tracer.start_as_current_span("op") as span:
        logger.warning("inside")
        ctx = span.get_span_context()
    entry = json.loads(stream.getvalue())
    assert entry["trace_id"] == format(ctx.trace_id, "032x")
    assert entry["span_id"] == format(ctx.span_id, "016x")


def test_exceptions_are_one_line() -> None:
    logger, stream = _capture()
    try:
        raise ValueError("bad")
    except ValueError:
        logger.exception("failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "ValueError: bad" in json.loads(lines[0])["exc"]


def test_configure_logging_replaces_its_own_handler() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    level = root.level
    try:
        first, second = io.StringIO(), io.StringIO()
        configure_logging("svc", "DEBUG", stream=first)
        configure_logging("svc", "DEBUG", stream=second)
        logging.getLogger("halcyon.test.root").debug("once")
        assert first.getvalue() == ""
        assert json.loads(second.getvalue())["msg"] == "once"
    finally:
        root.handlers = before
        root.setLevel(level)


def test_traceparent_round_trip(tracer: trace.Tracer) -> None:
    assert inject_metadata() == []  # no span: nothing to send
    with tracer.start_as_current_span("client") as span:
        metadata = inject_metadata()
        sent = span.get_span_context()
    keys = [k for k, _ in metadata]
    assert "traceparent" in keys
    # Servers see other metadata too, including binary values; those are ignored.
    incoming = [("authorization", "Bearer x"), ("x-bin", b"\x00"), *metadata]
    parent = trace.get_current_span(extract_context(incoming)).get_span_context()
    assert parent.is_remote
    assert parent.trace_id == sent.trace_id and parent.span_id == sent.span_id


def test_configure_tracing_sets_a_named_global_provider_once() -> None:
    # A subprocess: the global provider can be set only once per process.
    code = (
        "from common.tracing import configure_tracing\n"
        "from opentelemetry import trace\n"
        "p = configure_tracing('worker')\n"
        "assert configure_tracing('other') is p\n"
        "assert trace.get_tracer_provider() is p\n"
        "print(p.resource.attributes['service.name'])\n"
        "print(len(p._active_span_processor._span_processors))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["worker", "0"]  # no exporter without an OTLP endpoint
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["worker", "1"]
