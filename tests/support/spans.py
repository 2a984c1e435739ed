"""Spans in tests: one in-memory exporter on the process's global tracer provider.

What it decides: how a test process reads the spans its servers make. OpenTelemetry lets a
process set its global tracer provider only once, and the gateway and the serving pipeline take
their tracers from it, so every suite shares one exporter: an SDK provider already installed is
reused, else one is installed. Suites wrap :func:`global_span_exporter` in their own fixtures
(and clear it around each test).
"""

from __future__ import annotations

import functools

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["global_span_exporter"]


@functools.cache
def global_span_exporter() -> InMemorySpanExporter:
    """The process's one in-memory exporter on the global SDK tracer provider."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another non-SDK provider is installed"
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter
