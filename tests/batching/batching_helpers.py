"""Helpers for the batcher tests: a batcher on a device whose cost is known exactly."""

from __future__ import annotations

from common.clock import ManualClock
from gateway.batching import BatcherConfig, DeadlineBatcher, OnlineCostModel, ReplicaSlots

# A device of 10 ms + 0.1 ms/token, known exactly (no spread), so expected times are exact.
INTERCEPT = 0.010
SLOPE = 0.0001


def exact_model() -> OnlineCostModel:
    return OnlineCostModel(INTERCEPT, SLOPE, initial_spread=0.0)


def make_batcher(
    clock: ManualClock, config: BatcherConfig | None = None, *, slots: int = 1
) -> DeadlineBatcher[str]:
    batcher: DeadlineBatcher[str] = DeadlineBatcher(
        clock, config or BatcherConfig(horizon_s=10.0, linger_s=0.005)
    )
    batcher.add_replica(ReplicaSlots("r1", slots=slots), cost_model=exact_model())
    return batcher
