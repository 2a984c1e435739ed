"""Latency histograms: mergeable log-bucketed sketches and a rotating "recent" window.

What it decides: how a stream of durations (seconds) is summarised so that quantiles can be
read cheaply, merged across gateways/replicas/time slots, and exported as buckets.

Why log buckets (DDSketch-style): bucket ``i`` holds values in ``(gamma**(i-1), gamma**i]``
with ``gamma = (1 + a) / (1 - a)``. Reporting the bucket's representative ``2 * gamma**i /
(gamma + 1)`` is then within relative error ``a`` of *every* value in the bucket, so any
quantile read from the sketch is within ``a`` of the exact sample quantile, whatever the
distribution. Recording is one ``math.log`` and a list index; merging is element-wise
addition, so merging two sketches equals recording the union of their samples.

"Exact quantile" is defined once, here, by :func:`exact_quantile`: the sample at 1-based rank
``max(1, ceil(q * n))`` of the sorted samples. Sketch quantiles are held to that definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.clock import Clock

__all__ = ["LatencyHistogram", "RotatingHistogram", "exact_quantile", "quantile_rank"]


def quantile_rank(q: float, n: int) -> int:
    """The 1-based rank of the ``q`` quantile among ``n`` sorted samples: ``max(1, ceil(q*n))``."""
    _check_q(q)
    if n <= 0:
        raise ValueError(f"no rank exists among {n} samples")
    return min(n, max(1, math.ceil(q * n)))


def exact_quantile(samples: Sequence[float], q: float) -> float:
    """The reference quantile: the sample at rank :func:`quantile_rank` of the sorted samples.

    Returns 0.0 for no samples, matching :meth:`LatencyHistogram.quantile` on an empty sketch.
    """
    _check_q(q)
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[quantile_rank(q, len(ordered)) - 1]


def _check_q(q: float) -> None:
    # `not (0 <= q <= 1)` also rejects NaN.
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")


class LatencyHistogram:
    """A mergeable log-bucketed histogram of durations in seconds.

    Values below ``lowest`` are recorded as ``lowest`` and values above ``highest`` as
    ``highest``; every statistic (``total``, ``min``, ``max``, quantiles) describes the
    clamped values, so all of them agree with each other and merge exactly.
    """

    __slots__ = (
        "_count",
        "_counts",
        "_gamma",
        "_highest",
        "_inv_log_gamma",
        "_log_gamma",
        "_lowest",
        "_max",
        "_min",
        "_min_index",
        "_relative_error",
        "_total",
    )

    def __init__(
        self, lowest: float = 1e-6, highest: float = 600.0, relative_error: float = 0.01
    ) -> None:
        if not (math.isfinite(lowest) and math.isfinite(highest) and 0.0 < lowest < highest):
            raise ValueError(f"need 0 < lowest < highest, finite; got {lowest}, {highest}")
        if not 0.0 < relative_error < 1.0:
            raise ValueError(f"relative_error must be in (0, 1), got {relative_error}")
        self._lowest = float(lowest)
        self._highest = float(highest)
        self._relative_error = float(relative_error)
        self._gamma = (1.0 + relative_error) / (1.0 - relative_error)
        self._log_gamma = math.log(self._gamma)
        self._inv_log_gamma = 1.0 / self._log_gamma
        self._min_index = self._index(self._lowest)
        # A dense list: ~1,000 buckets for the default 1 us .. 10 min at 1 %, so indexing is
        # O(1) and merging is a flat element-wise add.
        self._counts: list[int] = [0] * (self._index(self._highest) - self._min_index + 1)
        self._count = 0
        self._total = 0.0
        self._min = math.inf
        self._max = -math.inf

    # -- configuration ------------------------------------------------------------------------

    @property
    def lowest(self) -> float:
        return self._lowest

    @property
    def highest(self) -> float:
        return self._highest

    @property
    def relative_error(self) -> float:
        return self._relative_error

    def _index(self, value: float) -> int:
        return math.ceil(math.log(value) * self._inv_log_gamma)

    def _same_config(self, other: LatencyHistogram) -> bool:
        return (
            self._lowest == other._lowest
            and self._highest == other._highest
            and self._relative_error == other._relative_error
        )

    # -- recording ----------------------------------------------------------------------------

    def record(self, value: float, count: int = 1) -> None:
        """Record ``count`` occurrences of ``value`` seconds (clamped to [lowest, highest])."""
        if math.isnan(value) or value < 0.0:
            raise ValueError(f"a duration must be a non-negative number, got {value}")
        if count < 0:
            raise ValueError(f"count must be non-negative, got {count}")
        if count == 0:
            return
        v = min(max(float(value), self._lowest), self._highest)
        self._counts[self._index(v) - self._min_index] += count
        self._count += count
        self._total += v * count
        if v < self._min:
            self._min = v
        if v > self._max:
            self._max = v

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s samples to this histogram; equal to having recorded both streams."""
        if not isinstance(other, LatencyHistogram) or not self._same_config(other):
            raise ValueError("cannot merge histograms with different lowest/highest/error")
        if other._count == 0:
            return
        counts = self._counts
        for i, c in enumerate(other._counts):
            if c:
                counts[i] += c
        self._count += other._count
        self._total += other._total
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def reset(self) -> None:
        """Forget every sample; the configuration stays."""
        self._counts = [0] * len(self._counts)
        self._count = 0
        self._total = 0.0
        self._min = math.inf
        self._max = -math.inf

    def copy(self) -> LatencyHistogram:
        """An independent histogram with the same configuration and samples."""
        dup = LatencyHistogram.__new__(LatencyHistogram)
        for name in LatencyHistogram.__slots__:
            setattr(dup, name, getattr(self, name))
        dup._counts = list(self._counts)
        return dup

    # -- reading ------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self._count

    @property
    def total(self) -> float:
        """The sum of the recorded (clamped) values, in seconds."""
        return self._total

    @property
    def mean(self) -> float:
        """The mean recorded value; 0.0 when empty."""
        return self._total / self._count if self._count else 0.0

    @property
    def min(self) -> float:
        """The smallest recorded (clamped) value, exactly; 0.0 when empty."""
        return self._min if self._count else 0.0

    @property
    def max(self) -> float:
        """The largest recorded (clamped) value, exactly; 0.0 when empty."""
        return self._max if self._count else 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (``q`` in [0, 1]) within ``relative_error`` of the exact one.

        Finds the bucket holding the sample at rank ``max(1, ceil(q * n))`` and returns its
        representative, clamped to [min, max] (the exact answer lies in that range, so the
        clamp can only reduce the error). The first and last ranks are answered exactly from
        ``min`` and ``max``. 0.0 when empty.
        """
        _check_q(q)
        if self._count == 0:
            return 0.0
        rank = quantile_rank(q, self._count)
        # The extreme ranks are known exactly, no bucket needed.
        if rank == 1:
            return self._min
        if rank == self._count:
            return self._max
        seen = 0
        for offset, c in enumerate(self._counts):
            seen += c
            if seen >= rank:
                return min(
                    max(self._representative(offset + self._min_index), self._min), self._max
                )
        raise AssertionError("bucket counts do not add up to count")  # pragma: no cover

    def _representative(self, index: int) -> float:
        # The point of (gamma**(i-1), gamma**i] whose relative distance to both ends is a.
        return 2.0 * math.exp(index * self._log_gamma) / (self._gamma + 1.0)

    def buckets(self) -> list[tuple[float, int]]:
        """Non-empty buckets as ``(upper bound in seconds, count)``, in increasing order.

        Counts are per bucket, not cumulative; a bucket holds values in
        ``(previous bound, upper bound]`` where the previous bound is ``upper / gamma``.
        """
        return [
            (math.exp((offset + self._min_index) * self._log_gamma), c)
            for offset, c in enumerate(self._counts)
            if c
        ]

    def __repr__(self) -> str:
        return (
            f"LatencyHistogram(count={self._count}, min={self.min:.6g}, "
            f"p50={self.quantile(0.5):.6g}, max={self.max:.6g})"
        )


class RotatingHistogram:
    """The last ``window_s`` seconds of samples, for "recent p95" questions (hedging).

    A ring of ``slots`` sub-histograms, each covering ``window_s / slots`` seconds of clock
    time (slot boundaries are multiples of that width). The live window is the current slot
    plus the ``slots - 1`` before it, so it spans between ``window_s - width`` and
    ``window_s`` of history; older slots are cleared as the clock passes them. Bucket counts
    of the live window are kept as a running sum (added on record, subtracted on expiry), so
    a record stays O(1) and a quantile costs one bucket scan, not a merge of every slot.
    """

    def __init__(
        self,
        clock: Clock,
        window_s: float = 10.0,
        slots: int = 5,
        **histogram_kwargs: float,
    ) -> None:
        if not (math.isfinite(window_s) and window_s > 0.0):
            raise ValueError(f"window_s must be positive and finite, got {window_s}")
        if slots < 1:
            raise ValueError(f"need at least one slot, got {slots}")
        self._clock = clock
        self._window_s = float(window_s)
        self._slots = slots
        self._width = self._window_s / slots
        self._ring = [LatencyHistogram(**histogram_kwargs) for _ in range(slots)]
        self._epochs: list[int | None] = [None] * slots
        self._live = LatencyHistogram(**histogram_kwargs)
        # The latest slot epoch seen: if a clock reading ever goes backward we keep writing
        # into the newest slot rather than resurrecting an expired one.
        self._epoch = self._epoch_of(clock.now())

    @property
    def window_s(self) -> float:
        return self._window_s

    @property
    def slots(self) -> int:
        return self._slots

    def _epoch_of(self, now: float) -> int:
        return math.floor(now / self._width)

    def _advance(self) -> int:
        """Move to the clock's current slot and drop slots that fell out of the window."""
        epoch = max(self._epoch, self._epoch_of(self._clock.now()))
        self._epoch = epoch
        for i, slot_epoch in enumerate(self._epochs):
            if slot_epoch is not None and slot_epoch <= epoch - self._slots:
                self._expire(i)
        return epoch

    def _expire(self, i: int) -> None:
        slot = self._ring[i]
        live = self._live._counts
        for j, c in enumerate(slot._counts):
            if c:
                live[j] -= c
        self._live._count -= slot._count
        slot.reset()
        self._epochs[i] = None

    def record(self, value: float) -> None:
        """Record one duration (seconds) at the clock's current time."""
        epoch = self._advance()
        i = epoch % self._slots
        if self._epochs[i] != epoch:
            # Cannot happen after _advance (an older epoch in this position has expired),
            # except for a never-used slot; either way the slot is empty here.
            self._epochs[i] = epoch
        self._ring[i].record(value)
        self._live.record(value)

    def _refresh_live_extremes(self) -> None:
        # min, max and total cannot be "subtracted" on expiry, so rebuild them from the
        # (few) live slots before reading.
        live = self._live
        slots = [s for s in self._ring if s.count]
        live._min = min((s._min for s in slots), default=math.inf)
        live._max = max((s._max for s in slots), default=-math.inf)
        live._total = math.fsum(s._total for s in slots)

    def snapshot(self) -> LatencyHistogram:
        """A copy of the live window as a plain histogram."""
        self._advance()
        self._refresh_live_extremes()
        return self._live.copy()

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the live window (0.0 when it holds no samples)."""
        self._advance()
        self._refresh_live_extremes()
        return self._live.quantile(q)

    @property
    def count(self) -> int:
        """How many samples the live window holds."""
        self._advance()
        return self._live.count

    def reset(self) -> None:
        """Forget every sample."""
        for i in range(self._slots):
            self._ring[i].reset()
            self._epochs[i] = None
        self._live.reset()
