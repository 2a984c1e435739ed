"""A batch a replica measured on its own runtime, as a plain value and as ``halcyon.v1``.

What it decides: the one conversion of a warm-up measurement between the worker (which runs
the batches before it registers), the controller (which checks and relays them whole) and the
gateway (which seeds the replica's cost model from them, so the first real batch already has
a prediction and its attempt timeout is derived from the replica's real cost, not a constant).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.durations import set_duration, to_seconds
from halcyon.v1 import fleet_pb2

__all__ = ["MAX_WARMUP_SAMPLES", "CostSampleValue"]

# A descriptor carries at most this many warm-up batches (the controller refuses more).
MAX_WARMUP_SAMPLES = 8


@dataclass(frozen=True, slots=True)
class CostSampleValue:
    """One measured batch: how many items, its work tokens (Σ input + max output tokens),
    its longest output budget, and the device seconds it took."""

    items: int
    batch_tokens: int
    longest_output_tokens: int
    seconds: float

    def to_proto(self) -> fleet_pb2.CostSample:
        sample = fleet_pb2.CostSample(
            items=self.items,
            batch_tokens=self.batch_tokens,
            longest_output_tokens=self.longest_output_tokens,
        )
        set_duration(sample.device_time, self.seconds)
        return sample

    @classmethod
    def from_proto(cls, sample: fleet_pb2.CostSample) -> CostSampleValue:
        return cls(
            items=sample.items,
            batch_tokens=sample.batch_tokens,
            longest_output_tokens=sample.longest_output_tokens,
            seconds=to_seconds(sample.device_time),
        )
