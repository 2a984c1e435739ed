"""Per-rollout evidence: what each arm of each running rollout did since the judge last looked.

What it decides: which request outcomes count for which rollout, and from when. A rollout
watches its model's baseline and canary versions from the moment it starts (or resumes):
outcomes reported before then are never seen, so pre-rollout traffic is never judged (defect 3
of the original), and the controller's rolling window (what GetState shows) plays no part.
:meth:`RolloutEvidence.take` hands the judge the *delta* since the previous take and starts
afresh, which is what :meth:`controller.canary.RolloutRun.observe` expects.

How an outcome is attributed: by the version the gateway assigned the request to — the same
sticky hash that routed it — so shed requests count against the arm that shed them. An arm's
latency sample holds answered requests only (ok and late): errors and sheds have no meaningful
latency and would make a failing arm look fast.

Faults are counted per attempt (ADR 0009): a batch of 20 that failed on the arm's replica is 20
errors (defect 4), *even when the gateway's retry then answered those requests*. The retry hides
a fault from the client while the version has spare capacity and the deadline has slack; it
does not make the version healthy — a canary whose replicas fail 5 % of batches would otherwise
show about 0.25 % request errors (5 % of 5 %) and be promoted. So per arm, per look::

    errors   = max(failed-batch items, requests that finally failed)
    requests = ok + late + shed + errors

A request that finally failed did so on a failed batch reported in the same report (its last
attempt), so the larger of the two counts each failed attempt once; the ``max`` keeps an error
that came from no batch (a reply missing from a successful batch) from being lost.

The batches themselves are counted too (``batches``, ``failed_batches``): the requests of one
batch fail together, so the judge's error test counts failed *batches* among batches — the
units that fail independently — and the request counts are what decisions show (ADR 0008).

Evidence arrives in gateway reports, about a second late; an outcome reported just after a
weight change may have been routed under the previous weight. Both arms are affected alike,
which is what a same-window comparison needs.

Pure: no clock, no I/O; fed by the outcome aggregator's tap on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.canary import ArmEvidence
from halcyon.v1 import control_pb2

__all__ = ["RolloutEvidence"]

Kind = control_pb2.RequestOutcomeKind
_ANSWERED = frozenset({Kind.REQUEST_OUTCOME_KIND_OK, Kind.REQUEST_OUTCOME_KIND_LATE})
_ERROR = Kind.REQUEST_OUTCOME_KIND_ERROR
_SHED = Kind.REQUEST_OUTCOME_KIND_SHED
# Latency samples kept per arm between two takes; beyond it requests are still counted but
# their latencies are not (a tick that fell far behind must not grow memory without bound).
MAX_LATENCIES = 200_000


@dataclass
class _Arm:
    answered: int = 0
    failed: int = 0  # requests whose final outcome was an error
    failed_attempts: int = 0  # items of failed batches
    shed: int = 0
    batches: int = 0  # batches run for the arm, ok or failed
    failed_batches: int = 0
    latencies: list[float] = field(default_factory=list)

    def evidence(self) -> ArmEvidence:
        errors = max(self.failed, self.failed_attempts)
        return ArmEvidence(
            requests=self.answered + self.shed + errors,
            errors=errors,
            shed=self.shed,
            latencies_s=tuple(self.latencies),
            batches=self.batches,
            failed_batches=self.failed_batches,
        )


class RolloutEvidence:
    """Accumulates per-arm outcome deltas for the models with a running rollout."""

    def __init__(self, *, max_latencies: int = MAX_LATENCIES) -> None:
        self._max_latencies = max_latencies
        # (model, version) -> arm; a model's two arms, baseline first.
        self._arms: dict[tuple[str, str], _Arm] = {}
        self._models: dict[str, tuple[str, str]] = {}

    def watch(self, model: str, baseline: str, canary: str) -> None:
        """Start (or restart) collecting for a rollout of ``model``: both arms from zero."""
        if baseline == canary:
            raise ValueError("baseline and canary must differ")
        self.unwatch(model)
        self._models[model] = (baseline, canary)
        self._arms[(model, baseline)] = _Arm()
        self._arms[(model, canary)] = _Arm()

    def unwatch(self, model: str) -> None:
        versions = self._models.pop(model, None)
        if versions is not None:
            for version in versions:
                self._arms.pop((model, version), None)

    def watching(self, model: str) -> tuple[str, str] | None:
        """(baseline, canary) being collected for ``model``, if any."""
        return self._models.get(model)

    def record(self, model: str, version: str, kind: int, latency_s: float) -> None:
        """Count one request outcome (the aggregator's tap: it has been validated)."""
        arm = self._arms.get((model, version))
        if arm is None:
            return
        if kind in _ANSWERED:
            arm.answered += 1
            if len(arm.latencies) < self._max_latencies:
                arm.latencies.append(latency_s)
        elif kind == _ERROR:
            arm.failed += 1
        elif kind == _SHED:
            arm.shed += 1

    def record_batch(self, model: str, version: str, size: int, ok: bool) -> None:
        """Count a batch — the unit the error test judges — and a failed one's items as
        failed attempts (the aggregator's tap)."""
        arm = self._arms.get((model, version))
        if arm is None:
            return
        arm.batches += 1
        if not ok:
            arm.failed_batches += 1
            arm.failed_attempts += size

    def take(self, model: str) -> tuple[ArmEvidence, ArmEvidence]:
        """(baseline, canary) since the previous take, and start both afresh."""
        baseline, canary = self._models[model]
        out = []
        for version in (baseline, canary):
            out.append(self._arms[(model, version)].evidence())
            self._arms[(model, version)] = _Arm()
        return out[0], out[1]
