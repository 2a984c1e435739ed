"""Under sustained overload, which requests are too large to be worth admitting at all?

What it decides: a size threshold θ (tokens). While it is active, a request larger than θ is
refused at admission (``SHED_FOR_GOODPUT``) even if it would fit in the plan right now.

Why: Moore–Hodgson drops the largest request *queued so far* whenever the plan overflows,
which is optimal when every job is known in advance. Online it is not: under steady overload
the plan overflows every few arrivals, and each overflow drops the largest survivor — which,
right after a big request was dropped, is often a medium one. The offline optimum instead
drops exactly the requests above one size (the one at which the rest just fits). θ learns
that size by feedback: every *forced* drop (an overflow the threshold failed to prevent —
a plan drop, an admission refusal or swap) lowers θ by a few percent; every dispatch with no
forced drop since the previous one raises it by a fraction of that. At equilibrium forced
drops are a small, fixed share of dispatches, and the ones that still happen pick from
requests just under θ, so nearly all shedding lands on the largest requests. When load falls,
forced drops stop and θ climbs out of the way within a few seconds; it is never active
without recent evidence of overload.

It serves the on-time-requests objective only: when the objective is on-time tokens, large
requests are worth as much per device-second as small ones and are not singled out.
"""

from __future__ import annotations

import math


class ShedThreshold:
    """A feedback-controlled admission size limit (``inf`` = inactive)."""

    __slots__ = ("_ceiling", "_decrease", "_drift", "_floor", "_increase", "_theta")

    def __init__(
        self, *, decrease: float = 0.1, drift: float = 0.0005, increase: float = 0.005
    ) -> None:
        if not 0.0 < decrease < 1.0 or drift <= 0.0 or increase <= 0.0:
            raise ValueError("need 0 < decrease < 1, drift > 0 and increase > 0")
        self._decrease = decrease
        self._drift = drift
        self._increase = increase
        self._theta = math.inf
        self._floor = 1.0
        self._ceiling = 0  # largest request seen while active: above it θ is meaningless

    @property
    def theta(self) -> float:
        """Current threshold in tokens; ``inf`` when inactive."""
        return self._theta

    def admits(self, tokens: int) -> bool:
        return tokens <= self._theta

    def set_floor(self, tokens: float) -> None:
        """Never go below ``tokens``: feedback alone cannot tell a structural overflow (one no
        admission limit prevents) from overload, and would otherwise ratchet θ to nothing."""
        self._floor = max(1.0, tokens)
        if self._theta < self._floor:
            self._theta = self._floor

    def after_dispatch(
        self,
        forced: int,
        forced_tokens: int,
        spare: bool,
        largest_queued: int,
        largest_seen: int,
    ) -> None:
        """Feedback once per dispatched batch: how many requests overflows forced out since the
        previous one and the largest of them, and whether the queue is short of a backlog."""
        if forced > 0:
            if math.isinf(self._theta):
                # Start at the largest request queued or forced out: the first cuts come from
                # the top of the observed sizes, never from the middle.
                self._theta = float(max(self._floor, largest_queued, forced_tokens))
                self._ceiling = max(largest_seen, largest_queued)
            else:
                # One step per dispatch, however many drops were forced since the last one.
                # Stepping further after a burst of forced drops (up to four steps) lowered
                # tail latency but cost goodput at 260 req/s on each of six seeds of the
                # published benchmark (e.g. 235.5 -> 233.2 req/s on seed 1).
                self._theta = max(self._floor, self._theta * (1.0 - self._decrease))
            return
        if math.isinf(self._theta):
            return
        self._ceiling = max(self._ceiling, largest_seen)
        self._theta *= 1.0 + (self._increase if spare else self._drift)
        if self._theta > 2.0 * self._ceiling:
            self._theta = math.inf  # no longer binding on anything: step aside
