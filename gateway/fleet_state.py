"""The gateway's soft copy of the fleet: which replicas serve which (model, version), and how
traffic for each model splits between versions.

The controller pushes full snapshots; this module diffs each one against what the gateway
holds, says what changed, and applies the change to the gateway's one owner of replica
membership (:class:`~gateway.replicas.Replicas`, ``FleetState.replicas``), whose change
events add and remove replicas in the pool and the dispatchers without restarting. It is the
only fleet state a gateway has, and losing it costs nothing but a resubscribe: when the
controller is away the last snapshot stays in force.

A snapshot normally is the whole fleet: what it does not list has left. A snapshot that says
``warming_up`` comes from a controller that has just (re)started and does not know the whole
fleet yet (ADR 0011), so it is *merged*: replicas it lists are added or updated, and a replica
the gateway knew from before is kept until the controller lists it, says it left, or ends its
warm-up with a snapshot that is the whole fleet again. "Says it left" means: listed earlier on
the same stream and no longer — the new controller knew it, and it went. Routing is merged the
same way, per model. Without this a restarted controller's first, empty snapshot emptied every
gateway until the workers had re-registered: an outage of the whole data path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.cost_samples import CostSampleValue
from gateway.replicas import ReplicaInfo, Replicas
from gateway.versioning import VersionSplit
from halcyon.v1 import control_pb2

ModelVersion = tuple[str, str]


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
        # The one owner of replica membership: what the diff below says changed is applied
        # to it, and it tells the pool and the dispatchers (gateway.replicas).
        self.replicas = Replicas()
        self.splits: dict[str, VersionSplit] = {}
        # Replicas kept from before the controller's warm-up, not (yet) listed by it.
        self.carried: set[str] = set()
        self._listed_on_stream: set[str] = set()

    def apply(
        self, snapshot: control_pb2.WatchFleetResponse, *, new_stream: bool = False
    ) -> FleetDiff:
        """Take in one snapshot; ``new_stream`` marks the first one of a (re)subscription."""
        if new_stream:
            self._listed_on_stream = set()
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
                runtime=d.runtime,
                warmup=tuple(CostSampleValue.from_proto(s) for s in d.warmup),
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
        self._listed_on_stream.update(seen)
        carried: set[str] = set()
        for rid, info in self.replicas.items():
            if rid in seen:
                continue
            if snapshot.warming_up and rid not in self._listed_on_stream:
                carried.add(rid)  # not re-registered yet: keep serving on what we knew
            else:
                diff.removed.append(info)
        splits: dict[str, VersionSplit] = dict(self.splits) if snapshot.warming_up else {}
        for r in snapshot.routing:
            if r.stable_version:
                splits[r.model] = VersionSplit(
                    r.model, r.stable_version, r.canary_version, min(r.canary_weight_bp, 10_000)
                )
        diff.splits_changed = splits != self.splits
        for info in diff.removed:
            self.replicas.remove(info.replica_id)
        for info in diff.added + diff.updated:
            self.replicas.insert(info)
        self.splits = splits
        self.carried = carried
        self.generation = snapshot.generation
        return diff

    def models(self) -> set[str]:
        return {r.model for r in self.replicas.values()} | set(self.splits)

    def replicas_of(self, model: str, version: str) -> list[ReplicaInfo]:
        return [r for r in self.replicas.values() if r.model == model and r.version == version]
