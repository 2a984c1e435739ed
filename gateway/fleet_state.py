"""The gateway's soft copy of the fleet: which replicas serve which (model, version), and how
traffic for each model splits between versions.

The controller pushes full snapshots; this module diffs each one against what the gateway
holds and says what changed, so dispatchers add and remove replicas without restarting. It
is the only fleet state a gateway has, and losing it costs nothing but a resubscribe: when the
controller is away the last snapshot stays in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.versioning import VersionSplit
from halcyon.v1 import control_pb2

ModelVersion = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """What a gateway needs to know of one replica."""

    replica_id: str
    address: str
    model: str
    version: str
    hardware: str
    slots: int
    speed: float
    draining: bool


@dataclass(slots=True)
class FleetDiff:
    """What one snapshot changed."""

    added: list[ReplicaInfo] = field(default_factory=list)
    updated: list[ReplicaInfo] = field(default_factory=list)
    removed: list[ReplicaInfo] = field(default_factory=list)
    splits_changed: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.updated or self.removed or self.splits_changed)


class FleetState:
    """Replicas and version splits as of the latest controller snapshot."""

    def __init__(self) -> None:
        self.generation = 0
        self.replicas: dict[str, ReplicaInfo] = {}
        self.splits: dict[str, VersionSplit] = {}

    def apply(self, snapshot: control_pb2.WatchFleetResponse) -> FleetDiff:
        diff = FleetDiff()
        seen: dict[str, ReplicaInfo] = {}
        for member in snapshot.replicas:
            d = member.replica
            info = ReplicaInfo(
                replica_id=d.replica_id,
                address=d.address,
                model=d.model,
                version=d.version,
                hardware=d.hardware,
                slots=max(1, d.slots),
                speed=d.speed if d.speed > 0 else 1.0,
                draining=member.load.draining,
            )
            seen[info.replica_id] = info
            old = self.replicas.get(info.replica_id)
            if old is None:
                diff.added.append(info)
            elif old != info:
                if (old.model, old.version, old.address) != (
                    info.model,
                    info.version,
                    info.address,
                ):
                    # A replica that changed identity is a different replica to dispatchers.
                    diff.removed.append(old)
                    diff.added.append(info)
                else:
                    diff.updated.append(info)
        diff.removed += [info for rid, info in self.replicas.items() if rid not in seen]
        splits: dict[str, VersionSplit] = {}
        for r in snapshot.routing:
            if r.stable_version:
                splits[r.model] = VersionSplit(
                    r.model, r.stable_version, r.canary_version, min(r.canary_weight_bp, 10_000)
                )
        diff.splits_changed = splits != self.splits
        self.replicas = seen
        self.splits = splits
        self.generation = snapshot.generation
        return diff

    def models(self) -> set[str]:
        return {r.model for r in self.replicas.values()} | set(self.splits)

    def replicas_of(self, model: str, version: str) -> list[ReplicaInfo]:
        return [r for r in self.replicas.values() if r.model == model and r.version == version]
