"""Seeded traffic for the rollout simulation: who is sent to the canary, and how each arm fares.

What it decides: the evidence a judge sees each second of a simulated rollout. Every second
brings ``Poisson(rate)`` requests; each request carries its own random numbers, drawn once per
seed and shared by every judge and every case (common random numbers):

* a **session key** in [0, 1): the request goes to the canary when its key is below the
  canary's share — sticky assignment, as the gateways do it, so raising the share only moves
  requests from baseline to canary;
* a **failure draw**: the request fails when the draw is below its arm's error rate;
* a **service draw**: log-normal service time (median ``service_median_s``, log-sd
  ``service_sigma``: request sizes vary);
* a **queueing draw**: an M/M/1 wait at its arm's utilisation ``ρ`` — zero with probability
  ``1 − ρ``, otherwise exponential with mean ``mean service / (1 − ρ)``.

So two judges that put the canary at the same share at the same second see the very same
requests, failures and latencies; they differ only in what they decide.

The cases (:data:`CASES`): identical versions (``aa``), five more error points (``errors``),
a 1.5× slowdown (``slow``: p95 × 1.5), a genuinely faster canary (``faster``: 0.7×), and
``underprovisioned``: one canary replica against two baseline replicas, the fleet at
``fleet_utilisation`` overall, so each arm's utilisation follows its share — the canary's
rises as it is ramped while the baseline's falls. In the other cases both arms run at
``utilisation`` whatever the share (capacity follows traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.canary import ArmEvidence

__all__ = [
    "CASES",
    "CHUNK_S",
    "Case",
    "ChunkDraws",
    "Traffic",
    "TrafficModel",
    "error_case",
    "tolerated_case",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TrafficModel:
    """The fleet and its traffic, shared by every case."""

    rate: float = 200.0  # requests per second, both arms together
    baseline_error_rate: float = 0.002
    service_median_s: float = 0.05
    service_sigma: float = 0.5
    utilisation: float = 0.5  # each arm's, when capacity follows the share
    fleet_utilisation: float = 0.5  # under-provisioned case: 3 replicas' worth of load
    baseline_replicas: int = 2
    canary_replicas: int = 1

    @property
    def mean_service_s(self) -> float:
        return self.service_median_s * float(np.exp(self.service_sigma**2 / 2.0))


@dataclass(frozen=True)
class Case:
    """A canary's behaviour against the baseline; ``bad`` says rollback is the right outcome."""

    name: str
    description: str
    canary_error_rate_increase: float = 0.0
    canary_latency_factor: float = 1.0
    underprovisioned: bool = False
    bad: bool = False


def error_case(points: float, name: str | None = None) -> Case:
    """A bad canary that fails ``points`` percentage points more requests than the baseline."""
    return Case(
        name or f"errors+{points:g}",
        f"canary fails {points:g} points more requests",
        canary_error_rate_increase=points / 100.0,
        bad=True,
    )


def tolerated_case(points: float) -> Case:
    """A good canary that fails ``points`` percentage points more, inside the tolerance.

    A rollback of it is a false alarm, and the judge's budget is a bound on exactly this kind of
    canary — at its tolerance, where an A/A canary sits well inside.
    """
    return Case(
        f"tolerated+{points:g}",
        f"canary fails {points:g} points more requests (inside the tolerance)",
        canary_error_rate_increase=points / 100.0,
    )


CASES: tuple[Case, ...] = (
    Case("aa", "identical versions (A/A)"),
    error_case(5.0, "errors"),
    Case("slow", "canary 1.5x slower (p95 x 1.5)", canary_latency_factor=1.5, bad=True),
    Case("faster", "canary genuinely faster (0.7x)", canary_latency_factor=0.7),
    Case(
        "underprovisioned",
        "identical versions, but 1 canary replica vs 2 baseline replicas: fine at a small "
        "share, saturated at a large one",
        underprovisioned=True,
        bad=True,
    ),
)


CHUNK_S = 16  # seconds of traffic drawn and turned into evidence at once (numpy batches)


@dataclass(frozen=True)
class ChunkDraws:
    """``CHUNK_S`` seconds of requests and their random numbers, concatenated.

    Second ``i`` of the chunk holds requests ``offsets[i]:offsets[i + 1]``.
    """

    offsets: npt.NDArray[np.int64]
    key: FloatArray  # session key in [0, 1)
    fail: FloatArray  # uniform: fails when below the arm's error rate
    service_s: FloatArray  # log-normal service time
    queued: FloatArray  # uniform: waits when below the arm's utilisation
    wait_units: FloatArray  # standard exponential x mean service time


Evidence = tuple[ArmEvidence, ArmEvidence]


class Traffic:
    """The draws of one seed, generated on demand and kept for every judge and case.

    Evidence is memoised per (case, chunk, share): judges that hold the same share at the same
    second receive the very same (immutable) evidence objects.
    """

    def __init__(self, model: TrafficModel, seed: int) -> None:
        self.model = model
        self._rng = np.random.default_rng(seed)
        self._chunks: list[ChunkDraws] = []
        self._memo: dict[tuple[str, int, float], list[Evidence]] = {}

    def chunk(self, index: int) -> ChunkDraws:
        m = self.model
        while len(self._chunks) <= index:
            counts = self._rng.poisson(m.rate, CHUNK_S)
            offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
            n = int(offsets[-1])
            u = self._rng.random((3, n))
            service = m.service_median_s * np.exp(m.service_sigma * self._rng.standard_normal(n))
            wait = self._rng.standard_exponential(n) * m.mean_service_s
            self._chunks.append(ChunkDraws(offsets, u[0], u[1], service, u[2], wait))
        return self._chunks[index]

    def utilisations(self, case: Case, share: float) -> tuple[float, float]:
        """(baseline, canary) utilisation at canary ``share`` in [0, 1]."""
        m = self.model
        if not case.underprovisioned:
            return m.utilisation, m.utilisation
        # Capacity in requests/s per replica is such that the whole fleet runs at
        # fleet_utilisation; each arm's replicas carry that arm's share of the traffic.
        replicas = m.baseline_replicas + m.canary_replicas
        per_replica = m.rate / (m.fleet_utilisation * replicas)
        baseline = (1.0 - share) * m.rate / (m.baseline_replicas * per_replica)
        canary = share * m.rate / (m.canary_replicas * per_replica)
        return baseline, canary

    def evidence(self, case: Case, second: int, share: float) -> Evidence:
        """The (baseline, canary) evidence of ``second`` with the canary at ``share``."""
        index, within = divmod(second, CHUNK_S)
        key = (case.name, index, share)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._chunk_evidence(case, index, share)
        return found[within]

    def _chunk_evidence(self, case: Case, index: int, share: float) -> list[Evidence]:
        d = self.chunk(index)
        m = self.model
        rho_b, rho_c = self.utilisations(case, share)
        to_canary = d.key < share
        canary_rate = m.baseline_error_rate + case.canary_error_rate_increase
        baseline = self._arm(d, ~to_canary, m.baseline_error_rate, 1.0, rho_b)
        canary = self._arm(d, to_canary, canary_rate, case.canary_latency_factor, rho_c)
        return list(zip(baseline, canary, strict=True))

    @staticmethod
    def _arm(
        d: ChunkDraws, mask: npt.NDArray[np.bool_], error_rate: float, factor: float, rho: float
    ) -> list[ArmEvidence]:
        answered = mask & (d.fail >= error_rate)
        latency = d.service_s
        if rho > 0.0:
            rho = min(rho, 0.99)  # beyond this the queue never drains: treat as saturated
            latency = latency + d.wait_units * (d.queued < rho) / (1.0 - rho)
        if factor != 1.0:
            latency = latency * factor
        requests = np.add.reduceat(mask, d.offsets[:-1]) if mask.size else None
        out = []
        for i in range(CHUNK_S):
            lo, hi = int(d.offsets[i]), int(d.offsets[i + 1])
            kept = latency[lo:hi][answered[lo:hi]]
            n = int(requests[i]) if requests is not None and hi > lo else 0
            out.append(ArmEvidence(requests=n, errors=n - int(kept.size), shed=0, latencies_s=kept))
        return out
