"""A heap-based discrete-event loop for the fleet simulations.

What it decides: the order in which simulated things happen. Events run in time order; events
at the same instant run in the order they were scheduled (a sequence number breaks ties), so
a run is a pure function of its seed. The loop owns a :class:`~common.clock.ManualClock` that
it sets to each event's time before running it, so policy objects that read a ``Clock`` see
simulated time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from common.clock import ManualClock

__all__ = ["EventLoop", "Timer"]


class Timer:
    """A scheduled callback that can be cancelled before it runs."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    def __init__(self, start: float = 0.0) -> None:
        self.clock = ManualClock(start)
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self.events_run = 0

    def now(self) -> float:
        return self.clock.now()

    def at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` at absolute time ``when`` (not earlier than now)."""
        timer = Timer(max(when, self.clock.now()), callback)
        heapq.heappush(self._heap, (timer.when, next(self._seq), timer))
        return timer

    def after(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.at(self.clock.now() + max(0.0, delay), callback)

    def run(self, until: float | None = None) -> None:
        """Run events in order until none are left (or the next is after ``until``)."""
        heap = self._heap
        while heap:
            when, _, timer = heap[0]
            if until is not None and when > until:
                break
            heapq.heappop(heap)
            if timer.cancelled:
                continue
            self.clock.set(when)
            self.events_run += 1
            timer.callback()
