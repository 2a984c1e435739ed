"""The fast-path method's ``grpc_server_*`` metrics, counted as the aio interceptor counts.

What it decides: which metric children one raw unary method updates, and how: counters
buffered (flushed at scrape, so a call costs no lock), the duration histogram observed
directly. The same families and labels as every other method of the process.
"""

from __future__ import annotations

from common.buffered_metrics import BufferedCounter
from common.grpc_metrics import GrpcServerMetrics, split_method


class _MethodMetrics:
    """The method's ``grpc_server_*`` children: counters buffered (flushed at scrape), the
    duration histogram observed directly."""

    def __init__(self, metrics: GrpcServerMetrics, method: str) -> None:
        service, name = split_method(method)
        labels = (service, name, "unary")
        self._metrics = metrics
        self._labels = labels
        self.started = BufferedCounter(metrics.started.labels(*labels))
        self.received = BufferedCounter(metrics.received.labels(*labels))
        self.sent = BufferedCounter(metrics.sent.labels(*labels))
        self.seconds = metrics.seconds.labels(*labels)
        self._handled: dict[str, BufferedCounter] = {}

    def handled(self, code: str) -> BufferedCounter:
        counter = self._handled.get(code)
        if counter is None:
            counter = BufferedCounter(self._metrics.handled.labels(*self._labels, code))
            self._handled[code] = counter
        return counter

    def flush(self) -> None:
        for counter in (self.started, self.received, self.sent, *list(self._handled.values())):
            counter.flush()
