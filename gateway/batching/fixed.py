"""The comparison batchers the gateway can serve with instead of Halcyon's (``--batching``).

What it decides: when and what to dispatch for the two baselines the seed's benchmark table
compares Halcyon against, so that the table's claims can be checked on a live stack and not
only in the simulator:

* ``fixed`` — :class:`FixedBatcher`, the seed's fixed batcher as its own description gives it
  ("fixed batch (32 / 25ms)", "32 items / 25 ms linger, FIFO, queue 512"; see
  ``bench/baselines.py:FixedBatchScheduler``, the simulator's rebuild of it): one FIFO queue
  per (model, version) of at most 512 requests (beyond: ``QUEUE_FULL``); a free replica slot
  takes the first 32 queued requests when 32 are waiting (flush reason ``FULL``) or once the
  oldest of them has waited 25 ms (``LINGER``), and otherwise waits. It is deadline-blind: no
  feasibility test at admission, no shedding for goodput, no reordering by deadline.
* ``none`` — :class:`UnbatchedBatcher`, one request per batch, FIFO, dispatched as soon as a
  replica slot is free (``CAPACITY``); the same queue ceiling.

Both expose exactly what :class:`~gateway.dispatcher.VersionDispatcher` uses of a
:class:`~gateway.batching.DeadlineBatcher` (:class:`BatchPolicy`), so admission, versioning,
routing, hedging and attempt timeouts stay the same and only the batching decision differs.
Two things are kept because the rest of the gateway depends on them, not because the seed had
them: a per-replica :class:`~gateway.batching.OnlineCostModel` learned from every completed
batch (the dispatcher derives attempt timeouts from it), and eviction of a queued request once
its deadline *has passed* (``DEADLINE_MISSED``: its caller gets an answer instead of a hang;
not earlier — the seed's batcher has no notion of "can no longer make it"). A request whose
deadline has already passed on arrival, or that arrives with no replica in service, is refused
as the Halcyon batcher refuses it (``DEADLINE_UNREACHABLE`` / ``NO_CAPACITY``); a retry that
avoids the replicas it failed on is held out of their batches as there.

Lanes are ignored (one FIFO for interactive and bulk work), as in the seed's fixed batcher.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from common.clock import Clock
from gateway.batching.batcher import DeadlineBatcher
from gateway.batching.config import BatcherConfig
from gateway.batching.cost_model import OnlineCostModel
from gateway.batching.lanes import _Replica
from gateway.batching.records import (
    Accepted,
    Batch,
    BatchItem,
    Dropped,
    DropReason,
    FlushReason,
    Lane,
    PredictionParts,
    Rejected,
    Seat,
)

__all__ = [
    "SEED_FIXED_LINGER_S",
    "SEED_FIXED_MAX_ITEMS",
    "SEED_FIXED_MAX_QUEUE",
    "BatchPolicy",
    "BatchingStrategy",
    "FixedBatcher",
    "UnbatchedBatcher",
    "make_batcher",
]

P = TypeVar("P")

# The seed's fixed batcher, from its benchmark description ("fixed batch (32 / 25ms)";
# "32 items / 25 ms linger, FIFO, queue 512").
SEED_FIXED_MAX_ITEMS = 32
SEED_FIXED_LINGER_S = 0.025
SEED_FIXED_MAX_QUEUE = 512

_EPSILON = 1e-9


class BatchingStrategy(StrEnum):
    """Which batcher a gateway serves with (``halcyon gateway --batching``)."""

    HALCYON = "halcyon"  # DeadlineBatcher: EDF, feasibility, goodput shedding
    FIXED = "fixed"  # the seed's fixed batcher: 32 items / 25 ms linger, FIFO, queue 512
    NONE = "none"  # one request per batch, FIFO

    @classmethod
    def parse(cls, text: str) -> BatchingStrategy:
        name = text.strip().lower()
        for strategy in cls:
            if name == strategy.value:
                return strategy
        allowed = ", ".join(s.value for s in cls)
        raise ValueError(f"unknown batching strategy {text!r}; expected one of {allowed}")


class BatchPolicy(Protocol[P]):
    """What the dispatcher uses of a batcher (see the package docstring for the protocol)."""

    @property
    def withheld(self) -> int: ...

    @property
    def depth(self) -> int: ...

    def add_replica(self, seat: Seat, *, cost_model: OnlineCostModel | None = None) -> None: ...

    def remove_replica(self, replica_id: str) -> None: ...

    def free_replicas(self) -> list[str]: ...

    def cost_model(self, replica_id: str) -> OnlineCostModel: ...

    def submit(
        self,
        payload: P,
        *,
        tokens: int,
        deadline: float,
        lane: Lane = Lane.INTERACTIVE,
        avoid: frozenset[str] = frozenset(),
        output_tokens: int = 0,
    ) -> Accepted[P] | Rejected: ...

    def take_batch(self, replica_id: str) -> Batch[P] | None: ...

    def complete(self, batch: Batch[P], measured_seconds: float) -> None: ...

    def fail(self, batch: Batch[P], *, requeue: bool = False) -> list[BatchItem[P]]: ...

    def take_dropped(self) -> list[Dropped[P]]: ...

    def next_wakeup(self, now: float | None = None) -> float | None: ...

    def poll(self) -> None: ...

    def close(self) -> None: ...

    def drain(self) -> list[BatchItem[P]]: ...


class FixedBatcher(Generic[P]):
    """FIFO batches of up to ``max_items``, flushed when full or ``linger_s`` after the oldest
    member arrived; at most ``max_queue`` queued; deadline-blind (module docstring)."""

    # Why a batch of ``max_items`` left (``UnbatchedBatcher``: a batch of one is "full" only
    # in the sense that a slot was free for it).
    _FULL_REASON = FlushReason.FULL
    _LINGER_REASON = FlushReason.LINGER

    def __init__(
        self,
        clock: Clock,
        *,
        max_items: int = SEED_FIXED_MAX_ITEMS,
        linger_s: float = SEED_FIXED_LINGER_S,
        max_queue: int = SEED_FIXED_MAX_QUEUE,
        tick_s: float = 0.001,
        prior_intercept_s: float = 0.010,
        prior_slope_s_per_token: float = 0.00005,
    ) -> None:
        if max_items < 1 or max_queue < 1:
            raise ValueError("fixed batching needs max_items >= 1 and max_queue >= 1")
        if linger_s < 0 or tick_s <= 0:
            raise ValueError("linger must be non-negative and the tick positive")
        self._clock = clock
        self.max_items = max_items
        self.linger_s = linger_s
        self.max_queue = max_queue
        self._tick = tick_s
        self._prior = (prior_intercept_s, prior_slope_s_per_token)
        # FIFO of queued items; an item leaves ``_live`` when dispatched, evicted or drained
        # and its stale entries here and in the deadline heap are skipped lazily.
        self._fifo: deque[BatchItem[P]] = deque()
        self._live: dict[int, BatchItem[P]] = {}  # seq -> item, in arrival order
        self._by_deadline: list[tuple[float, int]] = []  # (deadline, seq) heap
        self._seq = 0
        self._replicas: dict[str, _Replica[P]] = {}
        self._in_flight: dict[int, _Replica[P]] = {}
        self._next_batch_id = 1
        self._dropped: list[Dropped[P]] = []
        self._closed = False
        self._avoiders = 0  # queued-or-departed items submitted with an ``avoid`` set
        self.withheld = 0
        """How many retries the last ``take_batch`` held back from its replica."""
        # Free replicas offered the queue that could take only retries avoiding them: until
        # something changes, waking up for them would only spin.
        self._withheld_idle: set[str] = set()
        self.flushes = {reason.value: 0 for reason in FlushReason}
        self.drops = {reason.value: 0 for reason in DropReason}

    # -- replicas ------------------------------------------------------------------------

    def add_replica(self, seat: Seat, *, cost_model: OnlineCostModel | None = None) -> None:
        """Adds (or re-adds, or takes the new record of) a replica that runs ``seat.slots``
        concurrent batches, with its cost model."""
        if seat.slots < 1:
            raise ValueError("a replica needs at least one slot")
        replica_id = seat.replica_id
        existing = self._replicas.get(replica_id)
        if existing is not None and not existing.removed:
            existing.seat = seat
            if cost_model is not None:
                existing.model = cost_model
        else:
            model = cost_model
            if model is None:
                model = existing.model if existing is not None else OnlineCostModel(*self._prior)
            replica: _Replica[P] = _Replica(seat, model)
            if existing is not None:
                replica.in_flight = existing.in_flight
                for batch_id in replica.in_flight:
                    self._in_flight[batch_id] = replica
            self._replicas[replica_id] = replica
        self._withheld_idle.clear()

    def remove_replica(self, replica_id: str) -> None:
        """Stops giving work to a replica. Its in-flight batches still report back."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        replica.removed = True
        if not replica.in_flight:
            del self._replicas[replica_id]
        self._withheld_idle.clear()

    def replica_ids(self) -> list[str]:
        return [r.replica_id for r in self._replicas.values() if not r.removed]

    def free_replicas(self) -> list[str]:
        """Replicas with a free slot, in the order they were added."""
        return [r.replica_id for r in self._replicas.values() if r.free_slots() > 0]

    def cost_model(self, replica_id: str) -> OnlineCostModel:
        return self._replicas[replica_id].model

    # -- admission -----------------------------------------------------------------------

    def submit(
        self,
        payload: P,
        *,
        tokens: int,
        deadline: float,
        lane: Lane = Lane.INTERACTIVE,
        avoid: frozenset[str] = frozenset(),
        output_tokens: int = 0,
    ) -> Accepted[P] | Rejected:
        """Queues a request at the back of the FIFO, or refuses it: closed, no replica in
        service, the queue full, or a deadline already passed. No feasibility test.
        ``output_tokens`` (its output budget) only prices its batch for the cost model."""
        if tokens < 1:
            raise ValueError(f"a request needs at least one token, got {tokens}")
        if output_tokens < 0:
            raise ValueError(f"an output budget cannot be negative, got {output_tokens}")
        now = self._clock.now()
        if self._closed:
            return self._reject(DropReason.CLOSED)
        if not any(not r.removed for r in self._replicas.values()):
            return self._reject(DropReason.NO_CAPACITY)
        if len(self._live) >= self.max_queue:
            return self._reject(DropReason.QUEUE_FULL, retry_after=self._drain_estimate())
        if deadline <= now:
            self.drops[DropReason.DEADLINE_UNREACHABLE.value] += 1
            return Rejected(
                DropReason.DEADLINE_UNREACHABLE, now, None, PredictionParts(deadline - now)
            )
        self._seq += 1
        item = BatchItem(
            payload,
            tokens,
            deadline,
            lane,
            now,
            self._seq,
            avoid=avoid,
            output_tokens=output_tokens,
        )
        if avoid:
            self._avoiders += 1
        self._enqueue(item)
        self._withheld_idle.clear()
        return Accepted(item, now + self._drain_estimate())

    def _enqueue(self, item: BatchItem[P], *, front: bool = False) -> None:
        if front:
            self._fifo.appendleft(item)
            # Keep ``_live`` in FIFO order (drain and tests read it): rebuild with it first.
            self._live = {item.seq: item, **self._live}
        else:
            self._fifo.append(item)
            self._live[item.seq] = item
        heapq.heappush(self._by_deadline, (item.deadline, item.seq))

    def _reject(self, reason: DropReason, retry_after: float | None = None) -> Rejected:
        self.drops[reason.value] += 1
        return Rejected(reason, None, retry_after)

    def _drain_estimate(self) -> float:
        """Seconds for the queue ahead to be dispatched and run: its batches, spread over the
        slots in service, at the fastest replica's predicted batch cost."""
        queued = len(self._live)
        if not queued:
            return 0.0
        in_service = [r for r in self._replicas.values() if not r.removed]
        if not in_service:
            return 0.0
        batches = math.ceil(queued / self.max_items)
        tokens = sum(item.tokens for item in self._live.values()) / batches
        cost = min(r.model.predict(tokens) for r in in_service)
        slots = sum(r.slots for r in in_service)
        return batches * cost / slots

    # -- dispatch ------------------------------------------------------------------------

    def take_batch(self, replica_id: str) -> Batch[P] | None:
        """The batch to run now on a free slot of ``replica_id``, or ``None`` to keep waiting
        (fewer than ``max_items`` queued and the oldest has not waited ``linger_s``).

        Retries that avoid ``replica_id`` are held out of it while another replica is in
        service (``withheld`` says how many), so ``None`` may mean "offer another replica".
        """
        self.withheld = 0
        replica = self._replicas.get(replica_id)
        if replica is None or replica.free_slots() <= 0 or not self._live:
            return None
        self._compact()
        others = self.replica_ids() if self._avoiders else []
        chosen: list[BatchItem[P]] = []
        held = 0
        for item in self._fifo:
            if self._live.get(item.seq) is not item:
                continue
            if item.avoid and replica_id in item.avoid and any(o not in item.avoid for o in others):
                held += 1
                continue
            chosen.append(item)
            if len(chosen) >= self.max_items:
                break
        self.withheld = held
        if not chosen:
            if held:
                self._withheld_idle.add(replica_id)
            return None
        now = self._clock.now()
        if len(chosen) >= self.max_items:
            reason = self._FULL_REASON
        elif now - chosen[0].arrival >= self.linger_s - _EPSILON:
            reason = self._LINGER_REASON
        else:
            return None
        return self._dispatch(replica, chosen, reason, now)

    def _dispatch(
        self, replica: _Replica[P], items: list[BatchItem[P]], reason: FlushReason, now: float
    ) -> Batch[P]:
        for item in items:
            del self._live[item.seq]
            if item.avoid:
                self._avoiders -= 1
        self._compact()
        tokens = sum(item.tokens for item in items)
        model = replica.model
        batch = Batch(
            batch_id=self._next_batch_id,
            replica_id=replica.replica_id,
            items=items,
            tokens=tokens,
            reason=reason,
            dispatched_at=now,
            predicted_seconds=0.0,
            predicted_upper_seconds=0.0,
        )
        longest = batch.longest
        batch.predicted_seconds = model.predict(tokens, longest)
        batch.predicted_upper_seconds = model.upper(tokens, longest)
        self._next_batch_id += 1
        replica.in_flight[batch.batch_id] = batch
        self._in_flight[batch.batch_id] = replica
        self.flushes[reason.value] += 1
        return batch

    def _compact(self) -> None:
        """Forgets stale FIFO entries at the head (and the heap, when mostly stale)."""
        fifo, live = self._fifo, self._live
        while fifo and live.get(fifo[0].seq) is not fifo[0]:
            fifo.popleft()
        if len(self._by_deadline) > 4 * len(live) + 64:
            self._by_deadline = [(i.deadline, i.seq) for i in live.values()]
            heapq.heapify(self._by_deadline)
        if len(fifo) > 4 * len(live) + 64:
            self._fifo = deque(live.values())

    # -- outcomes ------------------------------------------------------------------------

    def complete(self, batch: Batch[P] | int, measured_seconds: float) -> None:
        """A batch finished: its slot frees and its replica's cost model learns the timing."""
        replica, found = self._finish(batch)
        replica.model.observe(found.tokens, measured_seconds, found.longest)

    def fail(self, batch: Batch[P] | int, *, requeue: bool = False) -> list[BatchItem[P]]:
        """A batch failed: its slot frees, the cost model is untouched. With ``requeue`` its
        requests go back to the head of the queue (in order); otherwise they are returned."""
        _replica, found = self._finish(batch)
        if not requeue:
            return list(found.items)
        for item in reversed(found.items):
            if item.avoid:
                self._avoiders += 1
            self._enqueue(item, front=True)
        return []

    def _finish(self, batch: Batch[P] | int) -> tuple[_Replica[P], Batch[P]]:
        batch_id = batch if isinstance(batch, int) else batch.batch_id
        replica = self._in_flight.pop(batch_id, None)
        if replica is None:
            raise KeyError(f"batch {batch_id} is not in flight")
        found = replica.in_flight.pop(batch_id)
        if (
            replica.removed
            and not replica.in_flight
            and self._replicas.get(replica.replica_id) is replica
        ):
            del self._replicas[replica.replica_id]
        self._withheld_idle.clear()
        return replica, found

    def take_dropped(self) -> list[Dropped[P]]:
        """Requests evicted (deadline passed) since the last call; answer each one."""
        dropped, self._dropped = self._dropped, []
        return dropped

    # -- time ----------------------------------------------------------------------------

    def poll(self) -> None:
        """Evicts queued requests whose deadline has passed (``DEADLINE_MISSED``)."""
        now = self._clock.now()
        heap, live = self._by_deadline, self._live
        while heap and heap[0][0] <= now:
            _deadline, seq = heapq.heappop(heap)
            item = live.pop(seq, None)
            if item is None:
                continue
            if item.avoid:
                self._avoiders -= 1
            self.drops[DropReason.DEADLINE_MISSED.value] += 1
            self._dropped.append(Dropped(item, DropReason.DEADLINE_MISSED, now, None))
        self._compact()

    def next_wakeup(self, now: float | None = None) -> float | None:
        """When to call ``poll``/``take_batch`` next without another event (never within a
        tick): the oldest request's linger while a slot is free, and the earliest deadline
        (its eviction). ``None`` when nothing is queued."""
        if not self._live:
            return None
        if now is None:
            now = self._clock.now()
        heap, live = self._by_deadline, self._live
        while heap and heap[0][1] not in live:
            heapq.heappop(heap)
        wake = heap[0][0] if heap else math.inf
        free = self.free_replicas()
        if free and not all(rid in self._withheld_idle for rid in free):
            if len(live) >= self.max_items:
                wake = now
            else:
                oldest = next(iter(live.values()))
                wake = min(wake, oldest.arrival + self.linger_s)
        earliest = now + self._tick
        return earliest if earliest > wake else wake

    # -- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """Stops admitting (``CLOSED``); queued work is still dispatched."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def drain(self) -> list[BatchItem[P]]:
        """Removes and returns everything still queued, in FIFO order."""
        items = list(self._live.values())
        self._live = {}
        self._fifo.clear()
        self._by_deadline = []
        self._avoiders = 0
        return items

    # -- observability -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self._live)

    def queued_items(self) -> list[BatchItem[P]]:
        """Everything queued, in FIFO order."""
        return list(self._live.values())


class UnbatchedBatcher(FixedBatcher[P]):
    """One request per batch, FIFO, dispatched as soon as a replica slot is free
    (``CAPACITY``); at most ``max_queue`` queued; deadline-blind."""

    _FULL_REASON = FlushReason.CAPACITY
    _LINGER_REASON = FlushReason.CAPACITY

    def __init__(
        self,
        clock: Clock,
        *,
        max_queue: int = SEED_FIXED_MAX_QUEUE,
        tick_s: float = 0.001,
        prior_intercept_s: float = 0.010,
        prior_slope_s_per_token: float = 0.00005,
    ) -> None:
        super().__init__(
            clock,
            max_items=1,
            linger_s=0.0,
            max_queue=max_queue,
            tick_s=tick_s,
            prior_intercept_s=prior_intercept_s,
            prior_slope_s_per_token=prior_slope_s_per_token,
        )


def make_batcher(
    strategy: BatchingStrategy, clock: Clock, config: BatcherConfig | None = None
) -> BatchPolicy[P]:
    """The batcher ``strategy`` names. ``config`` configures Halcyon's; the baselines take
    only its timer tick and cost-model prior from it (their sizes are the seed's)."""
    cfg = config or BatcherConfig()
    if strategy is BatchingStrategy.HALCYON:
        return DeadlineBatcher(clock, cfg)
    tick, intercept, slope = cfg.tick_s, cfg.prior_intercept_s, cfg.prior_slope_s_per_token
    if strategy is BatchingStrategy.FIXED:
        return FixedBatcher(
            clock, tick_s=tick, prior_intercept_s=intercept, prior_slope_s_per_token=slope
        )
    return UnbatchedBatcher(
        clock, tick_s=tick, prior_intercept_s=intercept, prior_slope_s_per_token=slope
    )
