"""Evidence accumulated for one arm: counts plus a bounded, deterministic latency sample.

What it decides: how much of an arm's evidence is kept. Counts are exact. Latencies are kept in
a buffer of at most ``capacity`` values that *decimates* when full: it drops every other value
and from then on keeps one arriving value in two (then four, ...), so the sample stays an
evenly spaced thinning of the whole stream — no randomness, no bias towards old or new values,
and memory that never grows with traffic.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from controller.canary.model import ArmEvidence, ArmSummary

__all__ = ["ArmAccumulator", "DecimatingSample"]

FloatArray = npt.NDArray[np.float64]


class DecimatingSample:
    """At most ``capacity`` latencies: an evenly thinned sample of everything added."""

    def __init__(self, capacity: int) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be an even number >= 2, got {capacity}")
        self._capacity = capacity
        self._buf = np.empty(capacity, dtype=np.float64)
        self._size = 0
        self._stride = 1
        self._offered = 0  # values offered so far; value i is kept iff i % stride == 0

    def add(self, values: FloatArray) -> None:
        start = 0
        while start < values.size:
            first = start + (-(self._offered + start)) % self._stride
            kept = values[first :: self._stride][: self._capacity - self._size]
            self._buf[self._size : self._size + kept.size] = kept
            self._size += int(kept.size)
            if self._size < self._capacity:
                break
            # Full: the last kept value sits at offered index (first + stride*(kept-1)).
            start = first + self._stride * (int(kept.size) - 1) + 1
            self._decimate()
        self._offered += int(values.size)

    def _decimate(self) -> None:
        half = self._buf[: self._size : 2].copy()
        self._size = int(half.size)
        self._buf[: self._size] = half
        self._stride *= 2

    def values(self) -> FloatArray:
        """The kept values (a view: copy before keeping it across ``add`` calls)."""
        return self._buf[: self._size]

    def __len__(self) -> int:
        return self._size


class ArmAccumulator:
    """One arm's evidence over a span of time (a window or a step)."""

    def __init__(self, capacity: int) -> None:
        self.requests = 0
        self.errors = 0
        self.shed = 0
        self.sample = DecimatingSample(capacity)

    def add(self, evidence: ArmEvidence, latencies: FloatArray) -> None:
        self.requests += evidence.requests
        self.errors += evidence.errors
        self.shed += evidence.shed
        self.sample.add(latencies)

    @property
    def failures(self) -> int:
        """Requests that count against the arm: errors and sheds."""
        return self.errors + self.shed

    @property
    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def summary(self) -> ArmSummary:
        values = self.sample.values()
        if values.size:
            p50, p95 = (float(v) for v in np.quantile(values, (0.5, 0.95)))
        else:
            p50 = p95 = math.nan
        return ArmSummary(
            requests=self.requests,
            errors=self.errors,
            shed=self.shed,
            error_rate=self.error_rate,
            p50_s=p50,
            p95_s=p95,
        )
