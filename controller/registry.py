"""Fleet membership by lease: who is in the fleet right now, and when that changed.

What it decides: a replica is a fleet member from the moment it registers until its session
ends (``remove``) or its lease lapses (no heartbeat within ``lease_ttl_s``; ``expire``).

A replica id is bound to its session: a second registration under the id of a live member is
refused (:class:`ReplicaIdInUse`, with the time its lease has left), so a holder of the fleet
credential cannot take over a running replica and point its traffic elsewhere. The id is free
again once the first session is gone — its stream ended, or its lease lapsed (a lapsed member
is expired on the spot by the new registration, which then starts a new *session*). Calls that
name an older session (a late heartbeat or the close of an expired stream) are ignored, so an
old stream can never remove or renew its successor. The cost: a worker whose connection broke
without the controller noticing (a half-open stream) re-registers only when its old lease
lapses, within ``lease_ttl_s``.

Why leases and not "stream open": a half-open TCP connection can keep a stream looking alive
for minutes; a lease makes a silent worker leave within ``lease_ttl_s`` (plus the sweep
period). A heartbeat that arrives after the lease lapsed does not revive the member — it is
expired on the spot and the worker must register again — so "a member is present iff its lease
is fresh and it was not removed" holds whenever ``expire`` has run.

``generation`` increases on every change gateways must see: a member joining, leaving or
being replaced, and a change of its ``draining`` state (reported by the worker or requested
by an operator). Busy-slot and batch counters ride along with heartbeats and are kept for
operators (GetState) but do not bump the generation: each gateway measures its own in-flight
work better than a once-a-second heartbeat could, and bumping on every heartbeat would push a
fleet snapshot to every gateway every second per replica.

Identifiers are bounded here, for every controller RPC (:func:`identifier_problem`): model and
version names at :data:`MAX_NAME_CHARS` (the gateway's own model limit), replica and gateway
ids at :data:`MAX_ID_CHARS` (a Kubernetes pod name always fits), addresses at
:data:`MAX_ADDRESS_CHARS`, the free-text hardware label at :data:`MAX_LABEL_CHARS`. The
controller repeats these strings in statuses, logs, fleet snapshots and GetState; an unbounded
one (a megabyte of replica id) made the typed refusal itself too large for a gRPC C-core
client's trailers. A too-long one is refused naming the field and its length, never repeating
it.

Pure and clock-injected: no I/O, no gRPC; the servicer maps the exceptions to statuses.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from common.clock import Clock
from common.cost_samples import MAX_WARMUP_SAMPLES
from common.durations import DurationOutOfRange, checked_seconds
from common.errors import echo
from halcyon.v1 import fleet_pb2

__all__ = [
    "MAX_ADDRESS_CHARS",
    "MAX_ID_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_NAME_CHARS",
    "FleetRegistry",
    "InvalidDescriptor",
    "LeaseExpired",
    "Member",
    "ReplicaIdInUse",
    "UnknownMember",
    "identifier_problem",
    "validate_descriptor",
]

# Model and version names: the gateway's model limit.
MAX_NAME_CHARS = 128
# A replica's hardware label: free text for operators, never repeated in a status.
MAX_LABEL_CHARS = 4096
# Replica and gateway ids: a DNS subdomain name, so a Kubernetes pod name always fits.
MAX_ID_CHARS = 253
# host:port, a DNS name or a bracketed IPv6 address with its port.
MAX_ADDRESS_CHARS = 261


def identifier_problem(value: str, limit: int, *, required: bool = True) -> str | None:
    """Why ``value`` is not an acceptable identifier (empty, or longer than ``limit``
    characters), or None. The description never repeats the value."""
    if required and not value.strip():
        return "must not be empty"
    if len(value) > limit:
        return f"at most {limit} characters, got {len(value):,}"
    return None


class InvalidDescriptor(ValueError):
    """A registration that names no replica, no address, … (``field`` is the descriptor field)."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


class UnknownMember(LookupError):
    """The replica (or that session of it) is not a fleet member."""


class LeaseExpired(Exception):
    """A heartbeat arrived after the lease lapsed; the member was expired and must re-register."""

    def __init__(self, member: Member) -> None:
        super().__init__(f"lease of replica {member.replica_id!r} expired")
        self.member = member


class ReplicaIdInUse(Exception):
    """A registration under the id of a live member; the id frees when that session ends or
    its lease lapses, ``retry_after_s`` from now at the latest."""

    def __init__(self, member: Member, retry_after_s: float) -> None:
        super().__init__(f"replica id {member.replica_id!r} is held by a live session")
        self.member = member
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Member:
    """One fleet member as the registry holds it. Times are readings of the injected clock."""

    descriptor: fleet_pb2.ReplicaDescriptor
    load: fleet_pb2.ReplicaLoad
    session: int
    registered_at: float
    lease_expires_at: float
    drain_requested: bool = False

    @property
    def replica_id(self) -> str:
        return self.descriptor.replica_id

    @property
    def draining(self) -> bool:
        """Draining as gateways must treat it: reported by the worker or asked by an operator."""
        return self.load.draining or self.drain_requested

    def effective_load(self) -> fleet_pb2.ReplicaLoad:
        """The last reported load with ``draining`` as gateways must see it."""
        load = fleet_pb2.ReplicaLoad()
        load.CopyFrom(self.load)
        load.draining = self.draining
        return load


def validate_descriptor(descriptor: fleet_pb2.ReplicaDescriptor) -> None:
    """Raise :class:`InvalidDescriptor` for a registration no gateway could route to."""
    for name, limit, required in _DESCRIPTOR_IDENTIFIERS:
        problem = identifier_problem(getattr(descriptor, name), limit, required=required)
        if problem is not None:
            if name == "address" and problem.startswith("must not be empty"):
                problem += " (host:port of the WorkerService)"
            raise InvalidDescriptor(name, problem)
    address = descriptor.address
    if any(c.isspace() for c in address):
        raise InvalidDescriptor("address", f"must not contain whitespace, got {echo(address)!r}")
    if descriptor.slots == 0:
        raise InvalidDescriptor("slots", "must be at least 1 (batches executed concurrently)")
    if not (math.isfinite(descriptor.speed) and descriptor.speed > 0.0):
        raise InvalidDescriptor(
            "speed", f"must be a positive finite number (1.0 = reference), got {descriptor.speed}"
        )
    if len(descriptor.runtime) > MAX_RUNTIME_CHARS or any(c.isspace() for c in descriptor.runtime):
        raise InvalidDescriptor(
            "runtime",
            f"must be a runtime kind such as 'simulated', got {echo(descriptor.runtime)!r}",
        )
    _validate_warmup(descriptor.warmup)


# (field, longest, required) of every string a descriptor carries but ``runtime``.
_DESCRIPTOR_IDENTIFIERS = (
    ("replica_id", MAX_ID_CHARS, True),
    ("address", MAX_ADDRESS_CHARS, True),
    ("model", MAX_NAME_CHARS, True),
    ("version", MAX_NAME_CHARS, True),
    ("hardware", MAX_LABEL_CHARS, False),
)


# A runtime kind is a short word ("simulated", "onnx", "oip").
MAX_RUNTIME_CHARS = 32
# No warm-up batch is longer than this: a gateway seeds its cost model with these numbers.
MAX_WARMUP_DEVICE_S = 3600


def _validate_warmup(samples: Sequence[fleet_pb2.CostSample]) -> None:
    """Warm-up batches a gateway can learn from: a few, each with items and a device time
    that is a real duration (valid, non-negative, at most an hour)."""
    if len(samples) > MAX_WARMUP_SAMPLES:
        raise InvalidDescriptor(
            "warmup", f"at most {MAX_WARMUP_SAMPLES} samples, got {len(samples)}"
        )
    for i, sample in enumerate(samples):
        field = f"warmup[{i}]"
        if sample.items == 0:
            raise InvalidDescriptor(f"{field}.items", "must be at least 1 (requests in the batch)")
        if sample.longest_output_tokens > sample.batch_tokens:
            raise InvalidDescriptor(
                f"{field}.longest_output_tokens",
                f"{sample.longest_output_tokens} is more than the batch's "
                f"{sample.batch_tokens} work tokens",
            )
        if not sample.HasField("device_time"):
            raise InvalidDescriptor(f"{field}.device_time", "must be set")
        try:
            checked_seconds(
                sample.device_time, f"{field}.device_time", maximum_s=MAX_WARMUP_DEVICE_S
            )
        except DurationOutOfRange as exc:
            raise InvalidDescriptor(exc.field, exc.description) from None


class FleetRegistry:
    """Fleet members keyed by replica id, each held by a lease of ``lease_ttl_s`` seconds."""

    def __init__(self, clock: Clock, lease_ttl_s: float) -> None:
        if not (math.isfinite(lease_ttl_s) and lease_ttl_s > 0.0):
            raise ValueError(f"lease_ttl_s must be positive and finite, got {lease_ttl_s}")
        self._clock = clock
        self._ttl = float(lease_ttl_s)
        self._members: dict[str, Member] = {}
        self._next_session = 1
        self._generation = 0

    @property
    def lease_ttl_s(self) -> float:
        return self._ttl

    @property
    def generation(self) -> int:
        """Increases on every change gateways must see (see the module docstring)."""
        return self._generation

    def _bump(self) -> None:
        self._generation += 1

    # -- changes ------------------------------------------------------------------------------

    def register(self, descriptor: fleet_pb2.ReplicaDescriptor) -> tuple[Member, Member | None]:
        """Admit a replica with a fresh lease, unless its id is held by a live member.

        Returns ``(new member, lapsed predecessor expired on the spot, or None)``. Raises
        :class:`InvalidDescriptor`, or :class:`ReplicaIdInUse` while a member with the same id
        holds a fresh lease.
        """
        validate_descriptor(descriptor)
        now = self._clock.now()
        holder = self._members.get(descriptor.replica_id)
        if holder is not None and holder.lease_expires_at > now:
            raise ReplicaIdInUse(holder, holder.lease_expires_at - now)
        stored = fleet_pb2.ReplicaDescriptor()
        stored.CopyFrom(descriptor)
        member = Member(
            descriptor=stored,
            load=fleet_pb2.ReplicaLoad(),
            session=self._next_session,
            registered_at=now,
            lease_expires_at=now + self._ttl,
        )
        self._next_session += 1
        self._members[member.replica_id] = member
        self._bump()
        return member, holder

    def heartbeat(
        self, replica_id: str, load: fleet_pb2.ReplicaLoad, session: int | None = None
    ) -> Member:
        """Renew the lease and record the load.

        Raises :class:`UnknownMember` if the replica (or that session) is not a member, and
        :class:`LeaseExpired` (after expiring it) if its lease had already lapsed.
        """
        member = self._current(replica_id, session)
        now = self._clock.now()
        if member.lease_expires_at <= now:
            del self._members[replica_id]
            self._bump()
            raise LeaseExpired(member)
        stored = fleet_pb2.ReplicaLoad()
        stored.CopyFrom(load)
        renewed = replace(member, load=stored, lease_expires_at=now + self._ttl)
        self._members[replica_id] = renewed
        if renewed.draining != member.draining:
            self._bump()
        return renewed

    def request_drain(self, replica_id: str) -> Member:
        """Mark a member draining at once (an operator asked), until it re-registers or an
        operator undrains it."""
        return self._set_drain_requested(replica_id, True)

    def cancel_drain(self, replica_id: str) -> Member:
        """Withdraw an operator's drain request (an operator undrained it).

        The member stays draining while the worker still reports ``draining``: gateways
        route to it again only once its heartbeat says it takes work, not before.
        """
        return self._set_drain_requested(replica_id, False)

    def _set_drain_requested(self, replica_id: str, requested: bool) -> Member:
        member = self._current(replica_id, None)
        if member.drain_requested == requested:
            return member
        changed = replace(member, drain_requested=requested)
        self._members[replica_id] = changed
        if changed.draining != member.draining:
            self._bump()
        return changed

    def remove(self, replica_id: str, session: int | None = None) -> Member | None:
        """End a membership (its session closed). Returns the member, or None if it was not one.

        With ``session``, only that session of the replica is removed: the close of a stream
        that was superseded by a re-registration leaves the new member alone.
        """
        member = self._members.get(replica_id)
        if member is None or (session is not None and member.session != session):
            return None
        del self._members[replica_id]
        self._bump()
        return member

    def expire(self, now: float | None = None) -> list[Member]:
        """Drop and return every member whose lease lapsed at or before ``now`` (default: now)."""
        at = self._clock.now() if now is None else now
        lapsed = [m for m in self._members.values() if m.lease_expires_at <= at]
        for member in lapsed:
            del self._members[member.replica_id]
        if lapsed:
            self._bump()
        return sorted(lapsed, key=lambda m: m.replica_id)

    # -- reading ------------------------------------------------------------------------------

    def _current(self, replica_id: str, session: int | None) -> Member:
        member = self._members.get(replica_id)
        if member is None or (session is not None and member.session != session):
            raise UnknownMember(
                f"replica {echo(replica_id)!r} is not a fleet member; GetState lists the replicas "
                "registered now"
            )
        return member

    def get(self, replica_id: str) -> Member | None:
        return self._members.get(replica_id)

    def is_current(self, replica_id: str, session: int) -> bool:
        """Whether ``session`` is the live session of ``replica_id``."""
        member = self._members.get(replica_id)
        return member is not None and member.session == session

    def members(self) -> list[Member]:
        """Members ordered by replica id (leases lapse only when ``expire`` runs)."""
        return [self._members[k] for k in sorted(self._members)]

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[Member]:
        return iter(self.members())

    def versions_by_model(self) -> dict[str, set[str]]:
        """The versions registered for each model."""
        out: dict[str, set[str]] = {}
        for member in self._members.values():
            out.setdefault(member.descriptor.model, set()).add(member.descriptor.version)
        return out
