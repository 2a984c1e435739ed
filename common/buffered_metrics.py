"""Counters the event loop bumps without a lock; their totals reach Prometheus at scrape time.

What it decides: how the hottest counters are kept. Every Infer call bumps several counters,
and a ``prometheus_client`` counter takes a mutex per increment — a measurable share of the
gateway's CPU per request. A :class:`BufferedCounter` is a plain int written only by the event
loop's thread; :class:`ScrapeHooks`, registered in the registry ahead of the families it feeds,
adds each counter's growth since the last scrape to its Prometheus child before those families
are read, so a scrape sees every increment made before it began. Names, labels and types on
``/metrics`` are exactly those of the underlying families. :class:`LoopHistogram` is the same
idea for histograms: plain lists written by the loop, exposed as a histogram family.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["BufferedCounter", "LoopHistogram", "ScrapeHooks"]


class _Incrementable(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class BufferedCounter:
    """A counter child's increments, buffered; :meth:`flush` hands them over."""

    __slots__ = ("_child", "_flushed", "count")

    def __init__(self, child: _Incrementable) -> None:
        self._child = child
        self.count = 0
        self._flushed = 0

    def inc(self) -> None:
        # Written only from the event loop's thread; the scrape thread only reads it.
        self.count += 1

    def flush(self) -> None:
        """Add the growth since the last flush to the child; under the hooks' lock."""
        count = self.count
        if count != self._flushed:
            self._child.inc(count - self._flushed)
            self._flushed = count


class ScrapeHooks(Collector):
    """Runs its hooks whenever the registry is collected; yields no metrics itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    def add(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def add_counters(self, counters: Iterable[BufferedCounter]) -> None:
        for counter in counters:
            self.add(counter.flush)

    def describe(self) -> list[Any]:
        return []  # no names of its own: registering it never collects

    def collect(self) -> list[Any]:
        with self._lock:  # two scrapes at once must not hand the same growth over twice
            for hook in list(self._hooks):
                hook()
        return []


class LoopHistogram(Collector):
    """A histogram family written by one thread (the event loop) without locks.

    Same exposition as a ``prometheus_client`` Histogram (``_bucket``/``_count``/``_sum``);
    an observation is a bisect and two additions instead of a scan and two locked
    increments. Reads at scrape time take a copy, and the count is derived from the copied
    buckets, so a scrape never shows a count that disagrees with its buckets.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = tuple(bounds)
        # The same ``le`` text prometheus_client's own histograms expose.
        self._le = [str(floatToGoString(b)) for b in bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], _LoopHistogramChild] = {}
        if not self._labelnames:
            self._children[()] = _LoopHistogramChild(self._bounds)
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _LoopHistogramChild:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _LoopHistogramChild(self._bounds)
        return child

    def observe(self, value: float) -> None:
        self._children[()].observe(value)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self._name, self._documentation, labels=list(self._labelnames))

    def describe(self) -> list[Any]:
        return [self._family()]

    def collect(self) -> list[Any]:
        family = self._family()
        for key, child in list(self._children.items()):
            counts = list(child.counts)
            cumulative = list(itertools.accumulate(counts))
            family.add_metric(list(key), list(zip(self._le, cumulative, strict=True)), child.sum)
        return [family]


class _LoopHistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Buckets are "less than or equal": the first bound >= value.
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value
