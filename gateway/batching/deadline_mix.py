"""What deadlines and how much work is this queue being sent? A rolling window of arrivals.

What it decides, from the most recent ``window`` requests (relative deadline = deadline minus
arrival, tokens, arrival time):

* **The mix of deadline budgets and sizes** that the batch horizon is chosen for (see
  ``horizon``): which budgets are present, how much work each brings.
* **How fast work that will jump the queue arrives** — the token rate of requests whose
  relative deadline is shorter than a given slack. Under EDF, a queued request with ``δ``
  seconds left will be overtaken by every future arrival whose whole budget is shorter than
  ``δ``; a plan that ignores them is optimistic exactly for the patient requests, and finds out
  too late (when the only requests it can still drop are the ones due now, not the largest).

Why a window rather than configured SLOs: the gateway serves whatever deadlines callers send,
and the mix changes.

Cost: both are recorded on every request, so recording is O(1) and allocation-light. The
horizon choice reads only the raw window (``ArrivalWindow``: one bounded deque append); the
per-class token table behind the overtaking rates is kept by ``ArrivalMix`` alone.
"""

from __future__ import annotations

import math
from collections import deque

# Relative deadlines are grouped in log-spaced classes 10 % wide for the work-rate table.
_CLASS_RATIO = math.log(1.1)


_REFRESH_EVERY = 16
# Fewer arrivals than this say nothing reliable about rates (two requests a microsecond apart
# are not a 2 M/s stream): below it, no overtaking is assumed.
_MIN_SAMPLE = 32


_PER_LOG = 1.0 / _CLASS_RATIO


class ArrivalWindow:
    """The last ``window`` arrivals as ``(relative deadline, tokens, arrival)``, nothing derived."""

    __slots__ = ("_order", "added")

    def __init__(self, window: int = 1024) -> None:
        if window < 1:
            raise ValueError("window must hold at least one arrival")
        # A bounded deque drops the oldest arrival as each new one is appended.
        self._order: deque[tuple[float, int, float]] = deque(maxlen=window)
        self.added = 0  # arrivals ever recorded (a cheap change counter for callers)

    def __len__(self) -> int:
        return len(self._order)

    def add(self, relative_deadline: float, tokens: int, arrival: float) -> None:
        self._order.append((relative_deadline, tokens, arrival))
        self.added += 1

    def window(self, now: float) -> tuple[list[tuple[float, int]], float]:
        """The recorded ``(relative deadline, tokens)`` pairs and the seconds they span."""
        order = self._order
        span = now - order[0][2] if order else 0.0
        return [(r, t) for r, t, _at in order], span


class ArrivalMix:
    """The last ``window`` arrivals: their deadlines and sizes, and work rate by deadline class."""

    __slots__ = ("_class_tokens", "_order", "_since_table", "_table", "_window", "added")

    def __init__(self, window: int = 1024) -> None:
        if window < 1:
            raise ValueError("window must hold at least one arrival")
        self._window = window
        self._order: deque[tuple[float, int, float, int]] = deque()
        self.added = 0  # arrivals ever recorded (a cheap change counter for callers)
        self._class_tokens: dict[int, int] = {}
        self._table: tuple[list[float], list[float]] | None = None
        self._since_table = 0

    def __len__(self) -> int:
        return len(self._order)

    def add(self, relative_deadline: float, tokens: int, arrival: float) -> None:
        # The class: floor(log(max(relative_deadline, 1e-6)) / log 1.1), max() spelled out.
        r = 1e-6 if relative_deadline < 1e-6 else relative_deadline
        cls = math.floor(math.log(r) * _PER_LOG)
        order = self._order
        class_tokens = self._class_tokens
        if len(order) == self._window:
            _old_r, old_tokens, _old_at, old_cls = order.popleft()
            left = class_tokens[old_cls] - old_tokens
            if left:
                class_tokens[old_cls] = left
            else:
                del class_tokens[old_cls]
                self._table = None
        order.append((relative_deadline, tokens, arrival, cls))
        self.added += 1
        known = class_tokens.get(cls)
        class_tokens[cls] = (known or 0) + tokens
        # Rates move slowly; refresh the table every few arrivals, or at once on a new class.
        self._since_table += 1
        if known is None or self._since_table >= _REFRESH_EVERY:
            self._table = None

    def window(self, now: float) -> tuple[list[tuple[float, int]], float]:
        """The recorded ``(relative deadline, tokens)`` pairs and the seconds they span."""
        order = self._order
        span = now - order[0][2] if order else 0.0
        return [(r, t) for r, t, _at, _cls in order], span

    def overtaking_rates(self, now: float) -> tuple[list[float], list[float]]:
        """``(bounds, rates)``: tokens per second arriving with a relative deadline below
        ``bounds[i]`` is ``rates[i]`` (non-decreasing). Empty until the window holds a
        meaningful sample."""
        if self._table is not None:
            return self._table
        order = self._order
        span = now - order[0][2] if order else 0.0
        bounds: list[float] = []
        rates: list[float] = []
        if len(order) >= _MIN_SAMPLE and span > 0.0:
            total = 0
            for cls in sorted(self._class_tokens):
                total += self._class_tokens[cls]
                # A request of this class overtakes anything with more slack than the class's
                # upper edge.
                bounds.append(math.exp((cls + 1) * _CLASS_RATIO))
                rates.append(total / span)
        self._table = (bounds, rates)
        self._since_table = 0
        return self._table
