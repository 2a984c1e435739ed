"""Who a replica is and how loaded it is, as plain values and as ``halcyon.v1`` messages.

What it decides: the one conversion of the worker's identity (sent on registration and in
Describe) and its load (sent with every heartbeat and in Describe) to protobuf, so the
controller and an operator's ``Describe`` always see the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.cost_samples import CostSampleValue
from halcyon.v1 import fleet_pb2

__all__ = ["LoadSnapshot", "ReplicaIdentity"]


@dataclass(frozen=True)
class ReplicaIdentity:
    """The static description of a replica."""

    replica_id: str
    address: str
    model: str
    version: str
    hardware: str
    slots: int
    speed: float
    runtime: str = ""  # ModelRuntime.kind
    # Batches measured on the runtime before registering (ModelRuntime.warm_up).
    warmup: tuple[CostSampleValue, ...] = ()

    def to_proto(self) -> fleet_pb2.ReplicaDescriptor:
        return fleet_pb2.ReplicaDescriptor(
            replica_id=self.replica_id,
            address=self.address,
            model=self.model,
            version=self.version,
            hardware=self.hardware,
            slots=self.slots,
            speed=self.speed,
            runtime=self.runtime,
            warmup=[sample.to_proto() for sample in self.warmup],
        )


@dataclass(frozen=True)
class LoadSnapshot:
    """A replica's load at one moment."""

    busy_slots: int
    batches_total: int
    batches_failed: int
    draining: bool

    def to_proto(self) -> fleet_pb2.ReplicaLoad:
        return fleet_pb2.ReplicaLoad(
            busy_slots=self.busy_slots,
            batches_total=self.batches_total,
            batches_failed=self.batches_failed,
            draining=self.draining,
        )
