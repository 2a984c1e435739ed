"""The judge on clustered evidence: failed batches, shared service times, bursts (ADR 0008).

A live fleet's evidence is not independent request by request: a failed batch fails all its
requests at once, and a noisy neighbour slows every request of a few seconds. These tests feed
the sequential tests such evidence from two arms that are *the same* and check that they stay
quiet — and that the same evidence read request by request (the defect of issue #20) does not.
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.canary import ArmEvidence, JudgePolicy
from controller.canary.sequential import SequentialTests

POLICY = JudgePolicy()


def batched_arm(
    rng: np.random.Generator,
    batches: int,
    size: int,
    batch_failure_rate: float,
    *,
    clustered: bool = True,
    slow: float = 1.0,
) -> ArmEvidence:
    """``batches`` batches of ``size``; a failed batch fails every request in it."""
    failed = rng.random(batches) < batch_failure_rate
    service = 0.05 * slow * np.exp(0.3 * rng.standard_normal(batches))  # shared per batch
    latencies = np.repeat(service[~failed], size) * np.exp(
        0.05 * rng.standard_normal(int((~failed).sum()) * size)
    )
    errors = int(failed.sum()) * size
    return ArmEvidence(
        requests=batches * size,
        errors=errors,
        latencies_s=latencies,
        batches=batches if clustered else 0,
        failed_batches=int(failed.sum()) if clustered else 0,
    )


def breaches(seed: int, *, clustered: bool, seconds: int = 600) -> str | None:
    """Two identical arms at 2 % batch failures, batches of 8 — does any test fire?"""
    rng = np.random.default_rng(seed)
    tests = SequentialTests(POLICY, 0.0075)
    for now in range(1, seconds + 1):
        base = batched_arm(rng, 20, 8, 0.02, clustered=clustered)
        canary = batched_arm(rng, 3, 8, 0.02, clustered=clustered)
        tests.observe(
            base, canary, np.asarray(base.latencies_s), np.asarray(canary.latencies_s), now
        )
        found = tests.check()
        if found is not None:
            return found.reason
    return None


def test_a_failed_batch_is_one_failure_and_a_looks_sheds_are_one() -> None:
    evidence = ArmEvidence(requests=40, errors=8, shed=12, batches=3, failed_batches=1)
    assert (evidence.clusters, evidence.failed_clusters) == (4, 2)
    alone = ArmEvidence(requests=40, errors=8, shed=12)  # no batches: a cluster per request
    assert (alone.clusters, alone.failed_clusters) == (40, 20)
    with pytest.raises(ValueError, match="failed_batches"):
        ArmEvidence(requests=8, batches=1, failed_batches=2)


def test_identical_arms_with_batch_failures_are_not_flagged() -> None:
    assert [breaches(seed, clustered=True) for seed in range(25)] == [None] * 25


def test_the_same_evidence_read_request_by_request_is_flagged() -> None:
    # The defect this judge fixes: eight errors at once read as eight independent failures.
    # Over 25 seeds it rolls back one or more (against none above, and a budget of 0.75 %).
    flagged = [breaches(seed, clustered=False) for seed in range(25)]
    assert sum(reason == "error_rate" for reason in flagged) >= 1


def test_a_burst_of_slow_requests_is_not_read_as_proof() -> None:
    # Five seconds of every canary request 3x slower (a warm-up, a noisy neighbour), then the
    # same as the baseline: the tail test sees one block, not five independent proofs.
    fired = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        tests = SequentialTests(POLICY, 0.0075)
        for now in range(1, 301):
            base = batched_arm(rng, 20, 8, 0.0)
            canary = batched_arm(rng, 12, 4, 0.0, slow=3.0 if 60 < now <= 65 else 1.0)
            tests.observe(
                base, canary, np.asarray(base.latencies_s), np.asarray(canary.latencies_s), now
            )
            found = tests.check()
            if found is not None:
                fired.append(found.reason)
                break
    assert fired == []


def test_a_canary_that_fails_five_percent_of_its_batches_is_still_caught() -> None:
    rng = np.random.default_rng(3)
    tests = SequentialTests(POLICY, 0.0075)
    for now in range(1, 601):
        base = batched_arm(rng, 20, 8, 0.002)
        canary = batched_arm(rng, 3, 8, 0.052)
        tests.observe(
            base, canary, np.asarray(base.latencies_s), np.asarray(canary.latencies_s), now
        )
        found = tests.check()
        if found is not None:
            assert found.reason == "error_rate"
            assert now < 300
            return
    pytest.fail("a canary failing 5 % of its batches was not caught in 600 s")
