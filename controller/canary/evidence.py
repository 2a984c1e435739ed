"""Evidence accumulated for one arm: counts plus a bounded, deterministic latency sample.

What it decides: how much of an arm's evidence is kept. Counts are exact. Latencies are kept,
sorted, in a buffer of at most ``capacity`` values that *decimates* when full: it keeps every
other value in sorted order (which preserves the sample's quantiles to within one rank step)
and from then on keeps one arriving value in two (then four, ...), so every kept value stands
for the same number of requests — no randomness, no bias towards old or new values, and memory
that never grows with traffic. Kept sorted, the sample answers quantiles and ranks by indexing
and binary search, which the per-tick sequential tests need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.canary.model import ArmEvidence, ArmSummary
from controller.canary.stats import sorted_quantile

__all__ = ["ArmAccumulator", "ClusterCounts", "DecimatingSample"]

FloatArray = npt.NDArray[np.float64]


class DecimatingSample:
    """At most ``capacity`` latencies, sorted: an even thinning of everything added."""

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self._capacity = capacity
        self._values: FloatArray = np.empty(0, dtype=np.float64)
        self._stride = 1
        self._offered = 0  # values offered so far; value i is kept iff i % stride == 0
        self._decimations = 0
        self.seen = 0  # every value ever offered

    def add(self, values: FloatArray) -> None:
        if values.size == 0:
            return
        first = (-self._offered) % self._stride
        kept = values[first :: self._stride] if self._stride > 1 else values
        self._offered += int(values.size)
        self.seen += int(values.size)
        merged = np.concatenate((self._values, np.sort(kept)))
        merged.sort(kind="stable")  # two sorted runs: a linear merge
        while merged.size > self._capacity:
            # Alternate which half is kept so repeated thinning does not drift low or high.
            merged = merged[self._decimations % 2 :: 2]
            self._decimations += 1
            self._stride *= 2
        self._values = merged

    def values(self) -> FloatArray:
        """The kept values, sorted ascending (do not modify)."""
        return self._values

    def __len__(self) -> int:
        return int(self._values.size)


@dataclass(frozen=True)
class ClusterCounts:
    """An arm's clusters and the failed ones, as the error test's ``Counts``."""

    failures: int
    requests: int


class ArmAccumulator:
    """One arm's evidence over a span of time (a window or a step)."""

    def __init__(self, capacity: int) -> None:
        self.requests = 0
        self.errors = 0
        self.shed = 0
        self.clusters = 0
        self.failed_clusters = 0
        self.sample = DecimatingSample(capacity)

    def add(self, evidence: ArmEvidence, latencies: FloatArray) -> None:
        self.requests += evidence.requests
        self.errors += evidence.errors
        self.shed += evidence.shed
        self.clusters += evidence.clusters
        self.failed_clusters += evidence.failed_clusters
        self.sample.add(latencies)

    @property
    def cluster_failure_rate(self) -> float:
        """Failed clusters (batches, shed requests) over clusters: what the error test judges."""
        return self.failed_clusters / self.clusters if self.clusters else 0.0

    def cluster_counts(self) -> ClusterCounts:
        return ClusterCounts(self.failed_clusters, self.clusters)

    @property
    def failures(self) -> int:
        """Requests that count against the arm: errors and sheds."""
        return self.errors + self.shed

    @property
    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def summary(self) -> ArmSummary:
        values = self.sample.values()
        p50, p95 = sorted_quantile(values, 0.5), sorted_quantile(values, 0.95)
        return ArmSummary(
            requests=self.requests,
            errors=self.errors,
            shed=self.shed,
            error_rate=self.error_rate,
            p50_s=p50,
            p95_s=p95,
        )
