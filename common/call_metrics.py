"""The metrics layer of the unary pipeline: ``grpc_server_*`` for every unary call.

What it decides: which metric children one unary method updates, and when — started and
received as the call enters the pipeline, handled (by Go-style code), sent (an OK answer) and
the duration when it ends — under the conventional families and labels
(:mod:`common.grpc_metrics`). Streaming methods are counted into the same per-method objects
by ``common.grpc_metrics.ServerMetricsInterceptor``. Counters are buffered (flushed at
scrape, so a call costs no lock); the duration histogram is observed directly. One
:class:`MethodMetrics` per method, made once when the host composes the method's pipeline;
both transports count through it.
"""

from __future__ import annotations

import time

import grpc

from common.buffered_metrics import BufferedCounter
from common.call import UnaryCall, Verdict
from common.grpc_metrics import GrpcServerMetrics, code_name, split_method
from common.pipeline import Layer

__all__ = ["CallMetrics", "MethodMetrics"]


class MethodMetrics(Layer):
    """One method's ``grpc_server_*`` children: the pipeline's metrics layer for a unary
    method, and what ``common.grpc_metrics.ServerMetricsInterceptor`` counts a streaming
    method's calls and messages with."""

    def __init__(self, metrics: GrpcServerMetrics, method: str, grpc_type: str = "unary") -> None:
        service, name = split_method(method)
        labels = (service, name, grpc_type)
        self._metrics = metrics
        self._labels = labels
        self.started = BufferedCounter(metrics.started.labels(*labels))
        self.received = BufferedCounter(metrics.received.labels(*labels))
        self.sent = BufferedCounter(metrics.sent.labels(*labels))
        self.seconds = metrics.seconds.labels(*labels)
        self._handled: dict[grpc.StatusCode, BufferedCounter] = {}

    def handled(self, code: grpc.StatusCode) -> BufferedCounter:
        counter = self._handled.get(code)
        if counter is None:
            counter = BufferedCounter(self._metrics.handled.labels(*self._labels, code_name(code)))
            self._handled[code] = counter
        return counter

    def admit(self, call: UnaryCall) -> Verdict:
        self.started.inc()
        self.received.inc()
        return None

    def ended(self, call: UnaryCall, code: grpc.StatusCode, details: str) -> None:
        if code is grpc.StatusCode.OK:
            self.sent.inc()
        self.finished(call.started, code)

    def finished(self, started: float, code: grpc.StatusCode) -> None:
        """A call that began at ``started`` (``time.perf_counter()``) ended with ``code``."""
        self.handled(code).inc()
        self.seconds.observe(time.perf_counter() - started)

    def flush(self) -> None:
        for counter in (self.started, self.received, self.sent, *list(self._handled.values())):
            counter.flush()


class CallMetrics:
    """The metrics of a host's calls: one :class:`MethodMetrics` per method (and kind)."""

    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._metrics = metrics
        self._methods: dict[tuple[str, str], MethodMetrics] = {}

    def for_method(self, method: str, grpc_type: str = "unary") -> MethodMetrics:
        found = self._methods.get((method, grpc_type))
        if found is None:
            found = MethodMetrics(self._metrics, method, grpc_type)
            self._methods[(method, grpc_type)] = found
        return found

    def flush(self) -> None:
        """Hand buffered counts to Prometheus (a scrape hook; any thread)."""
        for method in list(self._methods.values()):
            method.flush()
