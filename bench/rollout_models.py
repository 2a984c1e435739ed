"""Evidence models for the rollout simulation: how a live fleet turns traffic into evidence.

What it decides: nothing in production — what a judge is shown each simulated second. Three
models, from the one the judge's tests assume to the one a fleet produces:

* ``independent`` — :class:`bench.rollout_traffic.Traffic`: every request fails, and takes its
  time, independently of every other (one cluster per request). Kept as one case among several.
* ``batched`` — :class:`BatchedFleet`: each arm runs on its *own* replicas with their own queues
  (``FleetShape``: by default two baseline and two canary replicas, so at 50 % each arm carries
  its share on equal capacity, and at 1 % the canary runs nearly idle). Each second a replica
  serves the requests routed to it in back-to-back batches whose size follows its load (the
  steady state of a continuous batcher: ``s = λ·T(s)`` with ``T(s) = t0 + t1·s``, at most
  ``max_batch``); a batch's requests share its service time (one log-normal draw per batch) and
  each waits for the batch in flight before its own; a failed batch fails all its requests at
  once; a replica past its capacity queues (its backlog carries from second to second within
  a 16-second chunk and is bounded by ``max_wait_s``, beyond which requests are shed).
* ``bursty`` — ``batched`` plus what slows a burst of consecutive requests on one replica: a
  replica's warm-up (the canary's replicas start with the rollout, ``warmup_factor`` × slower,
  fading linearly over ``warmup_s``) and noisy-neighbour episodes on every replica (Poisson, one
  per ``burst_every_s`` per replica on average, exponential length of mean ``burst_s``, service
  ``burst_factor`` × slower while they last).

The cases are :data:`bench.rollout_traffic.CASES`: ``canary_error_rate_increase`` is the
canary's extra *batch* failure rate here, ``canary_latency_factor`` scales its service time,
and ``underprovisioned`` gives the canary one replica (vs two) with a quarter of the batch
ceiling — fine while its share is small, saturated at 50 %.

Every model is deterministic per seed. Evidence is memoised per (case, chunk, share), so judges
that hold the same share at the same second see the very same evidence; a different share
draws its own batches (their structure depends on the load).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bench.rollout_traffic import CHUNK_S, Case, Traffic, TrafficModel
from controller.canary import ArmEvidence

__all__ = [
    "EVIDENCE_MODELS",
    "BatchedFleet",
    "EvidenceSource",
    "FleetShape",
    "make_source",
]

FloatArray = npt.NDArray[np.float64]
Evidence = tuple[ArmEvidence, ArmEvidence]


class EvidenceSource(Protocol):
    """What the simulation reads: one second of (baseline, canary) evidence at a share."""

    def evidence(self, case: Case, second: int, share: float) -> Evidence: ...


@dataclass(frozen=True)
class FleetShape:
    """Replicas, their batch cost and the bursts that slow them (see the module docstring)."""

    baseline_replicas: int = 2
    canary_replicas: int = 2
    t0_s: float = 0.05  # fixed cost of a batch
    t1_s: float = 0.004  # cost per request in a batch
    max_batch: int = 16
    batch_sigma: float = 0.25  # log-sd of a batch's shared service-time draw
    request_sigma: float = 0.05  # log-sd of each request's own jitter
    max_wait_s: float = 2.0  # queueing beyond this is shed (a deadline)
    underprovisioned_max_batch: int = 4
    bursts: bool = False
    warmup_s: float = 10.0
    warmup_factor: float = 3.0
    burst_every_s: float = 120.0
    burst_s: float = 5.0
    burst_factor: float = 2.0
    horizon_s: int = 4000  # burst timelines are drawn this far ahead


@dataclass
class _Replica:
    slow_from: FloatArray = field(default_factory=lambda: np.empty(0))
    slow_to: FloatArray = field(default_factory=lambda: np.empty(0))

    def burst_factor(self, t: float, factor: float) -> float:
        hit = np.any((self.slow_from <= t) & (t < self.slow_to))
        return factor if hit else 1.0


def _shared_rng(seed: int, *salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, *salt])


class BatchedFleet:
    """The ``batched`` and ``bursty`` models (see the module docstring)."""

    def __init__(self, traffic: TrafficModel, shape: FleetShape, seed: int) -> None:
        self.traffic = traffic
        self.shape = shape
        self.seed = seed
        # The arrivals (count per second, session keys) are the independent model's own draws.
        self._arrivals = Traffic(traffic, seed)
        self._memo: dict[tuple[str, int, float], list[Evidence]] = {}
        self._replicas: dict[tuple[str, int], _Replica] = {}

    def evidence(self, case: Case, second: int, share: float) -> Evidence:
        index, within = divmod(second, CHUNK_S)
        key = (case.name, index, share)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._chunk(case, index, share)
        return found[within]

    def _replica(self, arm: str, index: int) -> _Replica:
        key = (arm, index)
        found = self._replicas.get(key)
        if found is None:
            found = _Replica()
            s = self.shape
            if s.bursts:
                rng = _shared_rng(self.seed, 7, 0 if arm == "baseline" else 1, index)
                count = int(rng.poisson(s.horizon_s / s.burst_every_s))
                starts = np.sort(rng.uniform(0.0, s.horizon_s, count))
                found = _Replica(starts, starts + rng.exponential(s.burst_s, count))
            self._replicas[key] = found
        return found

    def _chunk(self, case: Case, index: int, share: float) -> list[Evidence]:
        d = self._arrivals.chunk(index)
        to_canary = d.key < share
        m, s = self.traffic, self.shape
        canary_replicas = 1 if case.underprovisioned else s.canary_replicas
        canary_batch = s.underprovisioned_max_batch if case.underprovisioned else s.max_batch
        salt = round(share * 1_000_000)
        baseline = self._arm(
            d.offsets, ~to_canary, index, "baseline", s.baseline_replicas, s.max_batch,
            m.baseline_error_rate, 1.0, _shared_rng(self.seed, index, salt, 0),
        )  # fmt: skip
        canary = self._arm(
            d.offsets, to_canary, index, "canary", canary_replicas, canary_batch,
            m.baseline_error_rate + case.canary_error_rate_increase,
            case.canary_latency_factor, _shared_rng(self.seed, index, salt, 1),
        )  # fmt: skip
        return list(zip(baseline, canary, strict=True))

    def _slowdown(self, arm: str, replica: int, t: float) -> float:
        s = self.shape
        if not s.bursts:
            return 1.0
        factor = self._replica(arm, replica).burst_factor(t, s.burst_factor)
        if arm == "canary" and t < s.warmup_s:
            factor *= 1.0 + (s.warmup_factor - 1.0) * (1.0 - t / s.warmup_s)
        return factor

    def _arm(
        self,
        offsets: npt.NDArray[np.int64],
        mask: npt.NDArray[np.bool_],
        chunk: int,
        arm: str,
        replicas: int,
        max_batch: int,
        batch_error_rate: float,
        latency_factor: float,
        rng: np.random.Generator,
    ) -> list[ArmEvidence]:
        """A chunk of one arm: per replica-second load, then every batch and request at once."""
        s = self.shape
        summed = np.add.reduceat(mask, offsets[:-1]) if mask.size else np.zeros(CHUNK_S)
        per_second: npt.NDArray[np.int64] = np.where(np.diff(offsets) > 0, summed, 0).astype(
            np.int64
        )
        counts = rng.multinomial(per_second, [1.0 / replicas] * replicas)  # (CHUNK_S, replicas)
        groups = CHUNK_S * replicas
        size = np.ones(groups)
        batch_s = np.zeros(groups)  # a full batch's time at the group's size
        t0 = np.zeros(groups)
        t1 = np.zeros(groups)
        busy = np.zeros(groups)
        wait = np.zeros(groups)
        kept = np.zeros(groups, dtype=np.int64)
        shed = np.zeros(groups, dtype=np.int64)
        backlog = [0.0] * replicas  # seconds of queued work per replica, carried second to second
        for i in range(CHUNK_S):
            t = float(chunk * CHUNK_S + i)
            for r in range(replicas):
                g = i * replicas + r
                count = int(counts[i, r])
                if count == 0:
                    backlog[r] = 0.0
                    continue
                factor = latency_factor * self._slowdown(arm, r, t)
                a, b = s.t0_s * factor, s.t1_s * factor
                lam = float(count)
                # The steady-state batch of a continuous batcher at this load, and its capacity.
                steady = lam * a / (1.0 - lam * b) if lam * b < 1.0 else float(max_batch)
                g_size = min(max(1.0, steady), float(max_batch))
                capacity = g_size / (a + b * g_size)
                queued = max(0.0, backlog[r] + (lam - capacity) / capacity)
                dropped = 0
                if queued > s.max_wait_s:  # beyond the deadline: shed, not queued
                    dropped = min(count, math.ceil((queued - s.max_wait_s) * capacity))
                    queued = s.max_wait_s
                backlog[r] = queued
                size[g], t0[g], t1[g] = g_size, a, b
                batch_s[g] = a + b * g_size
                busy[g] = min(1.0, lam * (a + b))  # chance an arrival finds a batch in flight
                wait[g] = queued
                kept[g] = count - dropped
                shed[g] = dropped
        # Batches: each group's kept requests split into ceil(kept / size) near-equal batches.
        n_batches = np.where(kept > 0, np.ceil(kept / size), 0).astype(np.int64)
        group_of_batch = np.repeat(np.arange(groups), n_batches)
        first = np.cumsum(n_batches) - n_batches
        position = np.arange(int(n_batches.sum())) - first[group_of_batch]
        base = kept[group_of_batch] // n_batches[group_of_batch]
        extra = kept[group_of_batch] % n_batches[group_of_batch]
        sizes = base + (position < extra)
        service = (t0[group_of_batch] + t1[group_of_batch] * sizes) * np.exp(
            s.batch_sigma * rng.standard_normal(sizes.size)
        )
        failed = rng.random(sizes.size) < batch_error_rate
        # Requests: wait for the batch in flight (if busy) and the backlog, then their batch.
        batch_of_request = np.repeat(np.arange(sizes.size), sizes)
        group_of_request = group_of_batch[batch_of_request]
        n_requests = batch_of_request.size
        in_flight = rng.random(n_requests) < busy[group_of_request]
        waited = in_flight * rng.random(n_requests) * batch_s[group_of_request]
        latency = (waited + wait[group_of_request] + service[batch_of_request]) * np.exp(
            s.request_sigma * rng.standard_normal(n_requests)
        )
        answered = ~failed[batch_of_request]
        second_of_group = np.arange(groups) // replicas
        second_of_request = second_of_group[group_of_request]
        second_of_batch = second_of_group[group_of_batch]
        cuts = np.searchsorted(second_of_request, np.arange(CHUNK_S + 1))
        batches_per = np.bincount(second_of_batch, minlength=CHUNK_S)
        failed_per = np.bincount(second_of_batch, weights=failed, minlength=CHUNK_S)
        failed_items = np.bincount(second_of_batch, weights=failed * sizes, minlength=CHUNK_S)
        shed_per = shed.reshape(CHUNK_S, replicas).sum(axis=1)
        out: list[ArmEvidence] = []
        for i in range(CHUNK_S):
            lo, hi = int(cuts[i]), int(cuts[i + 1])
            out.append(
                ArmEvidence(
                    requests=int(per_second[i]),
                    errors=int(failed_items[i]),
                    shed=int(shed_per[i]),
                    latencies_s=latency[lo:hi][answered[lo:hi]],
                    batches=int(batches_per[i]),
                    failed_batches=int(failed_per[i]),
                )
            )
        return out


EVIDENCE_MODELS: dict[str, Callable[[TrafficModel, int], EvidenceSource]] = {
    "independent": lambda traffic, seed: Traffic(traffic, seed),
    "batched": lambda traffic, seed: BatchedFleet(traffic, FleetShape(), seed),
    "bursty": lambda traffic, seed: BatchedFleet(traffic, FleetShape(bursts=True), seed),
}


def make_source(name: str, traffic: TrafficModel, seed: int) -> EvidenceSource:
    """The evidence source ``name`` (one of :data:`EVIDENCE_MODELS`) for one seed."""
    try:
        factory = EVIDENCE_MODELS[name]
    except KeyError:
        known = ", ".join(EVIDENCE_MODELS)
        raise ValueError(f"unknown evidence model {name!r}: choose from {known}") from None
    return factory(traffic, seed)
