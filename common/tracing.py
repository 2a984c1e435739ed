"""OpenTelemetry tracing: the process's tracer provider and W3C context across gRPC calls.

What it decides: every process gets one global ``TracerProvider`` whose resource names the
service; spans are exported over OTLP/gRPC only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, so
nothing needs a collector to run and tests attach in-memory exporters. Trace context crosses
process boundaries as W3C ``traceparent`` (and ``tracestate``) call metadata: callers add
:func:`inject_metadata` to outgoing calls; servers start their span in
:func:`extract_context` of the incoming metadata (design section 6: gateway batch span ->
worker ExecuteBatch span).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

__all__ = [
    "OTLP_ENDPOINT_ENV",
    "configure_tracing",
    "extract_context",
    "inject_metadata",
    "spans_recorded",
]

OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SAMPLER_ENV = "OTEL_TRACES_SAMPLER"
_log = logging.getLogger("halcyon.tracing")
_spans_recorded = True


def spans_recorded() -> bool:
    """False when :func:`configure_tracing` chose to record nothing (no exporter configured):
    hot paths may then skip per-request spans altogether instead of making non-recording ones.
    """
    return _spans_recorded


def configure_tracing(service: str) -> TracerProvider:
    """Install (once per process) and return the global SDK tracer provider for ``service``.

    A second call returns the provider already installed: OpenTelemetry forbids replacing it.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    endpoint = os.environ.get(OTLP_ENDPOINT_ENV)
    sampler = None
    if not endpoint and not os.environ.get(SAMPLER_ENV):
        # Nothing would export the spans: don't record them, and let the hot paths (the
        # gateway's request and batch spans) skip making them at all (spans_recorded()):
        # the request path does not pay for spans nobody reads. An incoming sampled
        # traceparent is still honoured by the servers' own spans (ParentBased).
        sampler = ParentBased(ALWAYS_OFF)
    global _spans_recorded
    _spans_recorded = sampler is None
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}), sampler=sampler)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _log.info("exporting spans over OTLP", extra={"endpoint": endpoint})
    trace.set_tracer_provider(provider)
    return provider


def inject_metadata(context: Context | None = None) -> list[tuple[str, str]]:
    """``traceparent`` (and ``tracestate``) for an outgoing call, from the current span.

    Empty when there is no valid span, so it can always be appended to call metadata.
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return sorted(carrier.items())


def extract_context(metadata: Iterable[tuple[str, Any]] | None) -> Context:
    """The remote parent context carried in incoming call metadata (binary keys ignored)."""
    carrier: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            carrier[key.lower()] = value
    return propagate.extract(carrier)
