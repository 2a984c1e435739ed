"""The one owner of a gateway's replica membership, and the change events it sends.

What it decides: which replicas this gateway knows, and for each the one record of what it
is — identity, address, (model, version), slots, speed, draining flag and warm-up samples
(:class:`ReplicaInfo`). Nothing else in the gateway stores any of these: the consumers of
membership (the worker pool, and per (model, version) the router and the batcher inside its
dispatcher) hold a reference to the record they were last handed, never a copy of its
fields, and keep only the state that is truly their own — the pool its channel, the router
its latency estimate, breaker and in-flight count, the batcher its busy slots and cost model.

Why change events: membership arrives as snapshots (:mod:`gateway.fleet_state` diffs them),
but every consumer needs only "this replica is now this" and "this replica left". Those are
the two events, after tower's discovery ``Change::Insert(key, endpoint)`` /
``Change::Remove(key)``: :class:`Insert` adds a replica or replaces its record (a drain, an
undrain, new slots: the new record says so), :class:`Remove` ends it. A record is frozen, so
a consumer's reference cannot drift from the owner's; a consumer that got every event holds
exactly the owner's records.

Why its own module, not :class:`~gateway.fleet_state.FleetState` grown: reading snapshots
(the warm-up merge of ADR 0011, version splits) and holding members are two jobs.
``FleetState`` owns a :class:`Replicas` and applies each snapshot's diff to it; tests and the
dispatcher's own tests drive a :class:`Replicas` directly. A replica that joins draining is
a member like any other (listed, its channel open, never planned onto or picked).

Order: subscribers hear an :class:`Insert` in the order they subscribed and a
:class:`Remove` in the reverse order. The gateway subscribes the pool first, so a replica's
channel is open before any router can pick it and is closed only after no router can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from common.cost_samples import CostSampleValue
from gateway.warmup import prior_latency_s

__all__ = [
    "NOMINAL_BATCH_S",
    "Change",
    "Insert",
    "Remove",
    "ReplicaInfo",
    "Replicas",
    "Subscriber",
]

# Nominal device time for a typical batch at speed 1.0, the router's prior before any sample.
NOMINAL_BATCH_S = 0.05


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
    runtime: str = ""
    # What the replica measured before registering: seeds its cost model when it joins.
    warmup: tuple[CostSampleValue, ...] = ()

    @property
    def prior_latency_s(self) -> float:
        """Expected batch latency when idle: what its warm-up measured, else nominal / speed."""
        measured = prior_latency_s(self.warmup)
        return measured if measured is not None else NOMINAL_BATCH_S / self.speed

    @property
    def weight(self) -> float:
        """Share weight for routing: every replica counts alike (its speed is in the prior)."""
        return 1.0


@dataclass(frozen=True, slots=True)
class Insert:
    """``replica`` joined, or this is its new record (same identity, address, version)."""

    replica: ReplicaInfo


@dataclass(frozen=True, slots=True)
class Remove:
    """``replica`` (its last record) left: consumers forget it."""

    replica: ReplicaInfo


Change = Insert | Remove
Subscriber = Callable[[Change], None]


class Replicas(Mapping[str, ReplicaInfo]):
    """Replica id -> its record; every change goes through :meth:`insert` / :meth:`remove`
    and reaches every subscriber, in the order the module docstring gives."""

    def __init__(self) -> None:
        self._members: dict[str, ReplicaInfo] = {}
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        """Hear every later change (a subscriber added late is not replayed the past)."""
        self._subscribers.append(subscriber)

    def insert(self, replica: ReplicaInfo) -> None:
        """Add a replica or replace its record. A replica that changed identity, address or
        version is a different replica to its consumers: remove it first."""
        old = self._members.get(replica.replica_id)
        if old is not None and (old.model, old.version, old.address) != (
            replica.model,
            replica.version,
            replica.address,
        ):
            raise ValueError(f"replica {replica.replica_id} changed identity: remove it first")
        self._members[replica.replica_id] = replica
        change = Insert(replica)
        for subscriber in self._subscribers:
            subscriber(change)

    def remove(self, replica_id: str) -> None:
        replica = self._members.pop(replica_id, None)
        if replica is None:
            return
        change = Remove(replica)
        for subscriber in reversed(self._subscribers):
            subscriber(change)

    def __getitem__(self, replica_id: str) -> ReplicaInfo:
        return self._members[replica_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)
