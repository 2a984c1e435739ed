"""The batcher's vocabulary: lanes, reasons, queued items, batches and the answers it gives.

What it decides: nothing — it names things. Every way a request can leave the batcher has a
typed reason here, so the gateway can answer each caller precisely (``DEADLINE_EXCEEDED /
DEADLINE_UNREACHABLE`` for work that cannot make it, ``UNAVAILABLE / QUEUE_FULL`` for a full
queue, and so on) and metrics can count each outcome separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

P = TypeVar("P")


class Seat(Protocol):
    """What a batcher reads of a replica's record: who it is and how many batches it runs at
    once. The batcher keeps the record by reference (in the gateway, the membership owner's
    :class:`~gateway.replicas.ReplicaInfo`) and never a copy of its slots."""

    @property
    def replica_id(self) -> str: ...

    @property
    def slots(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ReplicaSlots:
    """A :class:`Seat` for a batcher driven on its own (the benchmark, tests)."""

    replica_id: str
    slots: int = 1


class Lane(StrEnum):
    """Interactive work is latency-critical; bulk work fills spare capacity and ages in."""

    INTERACTIVE = "interactive"
    BULK = "bulk"


class FlushReason(StrEnum):
    """Why a batch left the queue when it did."""

    DEADLINE = "deadline"  # waiting one more tick would breach a member's deadline
    FULL = "full"  # nothing more can join: size, token or duration ceiling, or a deadline
    LINGER = "linger"  # the oldest member waited the linger ceiling
    CAPACITY = "capacity"  # a replica slot freed up while work was waiting for one


class DropReason(StrEnum):
    """Why a request left the batcher without being served."""

    QUEUE_FULL = "queue_full"  # admission: the queue is at its depth limit
    NO_CAPACITY = "no_capacity"  # admission: no replica to run it on
    DEADLINE_UNREACHABLE = "deadline_unreachable"  # admission: predicted to finish too late
    DEADLINE_MISSED = "deadline_missed"  # queued: can no longer finish in time, even alone
    SHED_FOR_GOODPUT = "shed_for_goodput"  # queued: dropped so that more work finishes in time
    CLOSED = "closed"  # admission after close()


class Objective(StrEnum):
    """What the batcher maximises when it cannot serve everything in time."""

    ON_TIME_REQUESTS = "on_time_requests"  # the number of requests finished by their deadline
    ON_TIME_TOKENS = "on_time_tokens"  # the tokens of those requests (large work not singled out)

    @property
    def flag(self) -> str:
        """The ``--objective`` spelling shared by gateway and bench: ``requests`` / ``tokens``."""
        return self.value.removeprefix("on_time_")

    @classmethod
    def parse(cls, text: str) -> Objective:
        """``requests`` / ``tokens``, or the older ``on_time_requests`` / ``on_time_tokens``."""
        name = text.strip().lower()
        for objective in cls:
            if name in (objective.flag, objective.value):
                return objective
        allowed = ", ".join(o.flag for o in cls)
        raise ValueError(f"unknown objective {text!r}; expected one of {allowed}")


@dataclass(slots=True, eq=False)
class BatchItem(Generic[P]):
    """One queued request. ``payload`` is the caller's handle (e.g. a request id or future).

    Times are on the batcher's clock (seconds). Identity is the object itself: two items with
    equal fields are still two requests.
    """

    payload: P
    tokens: int
    deadline: float
    lane: Lane
    arrival: float
    seq: int
    # Set when a bulk item has waited the aging period and competes in the interactive lane.
    promoted: bool = False
    # Replicas this request already failed on: a retry is not planned onto them while another
    # replica is in service (set by ``DeadlineBatcher.submit(avoid=...)``).
    avoid: frozenset[str] = frozenset()
    # Its output budget (max output tokens; 0 when unknown): an autoregressive batch decodes
    # until its longest output is done, so this prices the batch's decode steps.
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Accepted(Generic[P]):
    """The request is queued; ``predicted_completion`` is the batcher's current estimate."""

    item: BatchItem[P]
    predicted_completion: float


@dataclass(frozen=True, slots=True)
class PredictionParts:
    """What a ``DEADLINE_UNREACHABLE`` prediction is made of, in seconds after the decision.

    They add up to the predicted time to completion: the replica slot finishing the batch
    already on its device, then the batches planned ahead on that slot, then its own batch
    (the members ahead of it in that batch, its own work) and a safety margin (cost
    uncertainty and the expected delay from later, more urgent arrivals overtaking it).
    """

    deadline_in: float  # time left to its deadline (<= 0: it had passed on arrival)
    on_device: float = 0.0
    queued_ahead: float = 0.0
    sharing_batch: float = 0.0
    own: float = 0.0
    margin: float = 0.0
    queued_requests: int = 0  # requests waiting in the queue when it arrived
    batch_mates: int = 0  # requests ahead of it in the batch it would have joined

    @property
    def total(self) -> float:
        return self.on_device + self.queued_ahead + self.sharing_batch + self.own + self.margin


@dataclass(frozen=True, slots=True)
class Rejected:
    """The request was refused at admission, in microseconds, before it cost anything.

    ``predicted_completion`` is when it would have finished (``None`` when the refusal is not
    about time, e.g. a full queue); ``retry_after`` is how long until retrying could work
    (the predicted time for the queue ahead to drain), never a constant. ``parts`` breaks a
    ``DEADLINE_UNREACHABLE`` prediction down for the caller's error message.
    """

    reason: DropReason
    predicted_completion: float | None
    retry_after: float | None
    parts: PredictionParts | None = None


@dataclass(frozen=True, slots=True)
class Dropped(Generic[P]):
    """A queued request the batcher gave up on, with the evidence behind the decision."""

    item: BatchItem[P]
    reason: DropReason
    at: float
    predicted_completion: float | None


@dataclass(slots=True, eq=False)
class Batch(Generic[P]):
    """A batch handed to one replica slot. Report it back with ``complete`` or ``fail``."""

    batch_id: int
    replica_id: str
    items: list[BatchItem[P]]
    tokens: int
    reason: FlushReason
    dispatched_at: float
    predicted_seconds: float
    predicted_upper_seconds: float

    @property
    def payloads(self) -> list[P]:
        return [item.payload for item in self.items]

    @property
    def longest(self) -> int:
        """The largest output budget among its items: the decode steps it runs (0: unknown)."""
        longest = 0
        for item in self.items:
            if item.output_tokens > longest:
                longest = item.output_tokens
        return longest
