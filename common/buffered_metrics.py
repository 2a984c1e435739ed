"""Counters the event loop bumps without a lock; their totals reach Prometheus at scrape time.

What it decides: how the hottest counters are kept. Every Infer call bumps several counters,
and a ``prometheus_client`` counter takes a mutex per increment — a measurable share of the
gateway's CPU per request. A :class:`BufferedCounter` is a plain int written only by the event
loop's thread; :class:`ScrapeHooks`, registered in the registry ahead of the families it feeds,
adds each counter's growth since the last scrape to its Prometheus child before those families
are read, so a scrape sees every increment made before it began. Names, labels and types on
``/metrics`` are exactly those of the underlying families.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from prometheus_client.registry import Collector

__all__ = ["BufferedCounter", "ScrapeHooks"]


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
