"""The rollout simulation's evidence models: clustered the way a live fleet clusters evidence."""

from __future__ import annotations

import numpy as np
import pytest

from bench.rollout_models import EVIDENCE_MODELS, BatchedFleet, FleetShape, make_source
from bench.rollout_traffic import CASES, TrafficModel
from controller.canary import ArmEvidence

CASE = {case.name: case for case in CASES}


def seconds(
    source: BatchedFleet, case: str, share: float, span: range
) -> list[tuple[ArmEvidence, ArmEvidence]]:
    return [source.evidence(CASE[case], t, share) for t in span]


def test_every_model_is_known_and_deterministic() -> None:
    assert list(EVIDENCE_MODELS) == ["independent", "batched", "bursty"]
    with pytest.raises(ValueError, match="unknown evidence model"):
        make_source("lognormal", TrafficModel(), 1)
    for name in EVIDENCE_MODELS:
        a = make_source(name, TrafficModel(), 5).evidence(CASE["aa"], 20, 0.25)
        b = make_source(name, TrafficModel(), 5).evidence(CASE["aa"], 20, 0.25)
        assert a[1].requests == b[1].requests and a[1].errors == b[1].errors
        assert np.array_equal(np.asarray(a[1].latencies_s), np.asarray(b[1].latencies_s))


def test_a_failed_batch_fails_all_its_requests_at_once() -> None:
    source = BatchedFleet(TrafficModel(), FleetShape(), 3)
    evidence = [arm for pair in seconds(source, "errors", 0.5, range(64)) for arm in pair]
    failed = [e for e in evidence if e.failed_batches]
    assert failed, "a 5 % batch failure rate fails some batches in 64 s"
    # Errors come in whole batches: more failed requests than failed batches at this load.
    assert sum(e.errors for e in failed) > sum(e.failed_batches for e in failed)
    assert all(e.errors == 0 for e in evidence if e.failed_batches == 0)


def test_batch_size_follows_each_arms_load() -> None:
    source = BatchedFleet(TrafficModel(), FleetShape(), 4)
    pairs = seconds(source, "aa", 0.01, range(64))
    baseline_per_batch = sum(b.requests for b, _ in pairs) / sum(b.batches for b, _ in pairs)
    canary_per_batch = sum(c.requests for _, c in pairs) / max(1, sum(c.batches for _, c in pairs))
    assert baseline_per_batch > 4.0  # 99 % of 200 req/s on two replicas: large batches
    assert canary_per_batch < 1.5  # 1 % on its own two replicas: nearly idle, batches of one
    b_lat = np.concatenate([np.asarray(b.latencies_s) for b, _ in pairs])
    c_lat = np.concatenate([np.asarray(c.latencies_s) for _, c in pairs])
    assert np.median(c_lat) < np.median(b_lat)  # an idle canary answers faster


def test_an_underprovisioned_canary_is_fine_small_and_saturated_large() -> None:
    source = BatchedFleet(TrafficModel(), FleetShape(), 6)

    def canary_p50(share: float) -> float:
        pairs = seconds(source, "underprovisioned", share, range(32, 64))
        return float(np.median(np.concatenate([np.asarray(c.latencies_s) for _, c in pairs])))

    def baseline_p50(share: float) -> float:
        pairs = seconds(source, "underprovisioned", share, range(32, 64))
        return float(np.median(np.concatenate([np.asarray(b.latencies_s) for b, _ in pairs])))

    assert canary_p50(0.05) < baseline_p50(0.05)
    assert canary_p50(0.5) > 2 * baseline_p50(0.5)  # one small replica carrying half the load


def test_bursts_slow_the_canarys_warm_up_and_only_the_bursty_model_has_them() -> None:
    bursty = BatchedFleet(TrafficModel(), FleetShape(bursts=True), 2)
    calm = BatchedFleet(TrafficModel(), FleetShape(), 2)

    def p50(source: BatchedFleet, span: range) -> float:
        pairs = seconds(source, "aa", 0.5, span)
        return float(np.median(np.concatenate([np.asarray(c.latencies_s) for _, c in pairs])))

    assert p50(bursty, range(0, 4)) > 1.5 * p50(calm, range(0, 4))  # warming up
    assert p50(bursty, range(0, 4)) > 1.5 * p50(bursty, range(20, 24))  # then warm
